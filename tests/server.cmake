# The server: protocol grammar and chat templates (unit), then the real thing over sockets.
ll_test(NAME test_proto SOURCES test_proto.c LIBS ll_server LABELS unit ARGS ${CMAKE_CURRENT_SOURCE_DIR}/ref/qwen3_chat.json)
# The server through real sockets on the embedded demo model: protocol, 64 concurrent clients
# (greedy outputs equal single-client ones), cancel, the bad-input battery (PING within 50 ms
# after each, no fd growth), limits, monitor socket modes/schema/control, auth, SIGTERM.
# Runs in the ASan build too (LSan checks the server's exit).
ll_script_test(NAME server_sockets COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server.py
  LABELS integration TIMEOUT 300)
# Chat templates on the demo's byte vocabulary: chat_template (built-in names, a template file,
# unknown names refused) for CHAT, generate --chat and train; message contents stay text.
ll_script_test(NAME server_chat COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server_chat.py
  LABELS integration TIMEOUT 300)
# The real model behind the server: 64 clients x 32 tokens equal to alone, CHAT = generate --chat.
ll_script_test(NAME server_smollm2 COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server_smollm2.py
  LABELS "integration;slow" TIMEOUT 600 FIXTURES smollm2)
# The option table: YAML errors with file:line:col, CLI over --config, configs/*.yaml load,
# man/llsrv.yaml.5 generated from the table (gen_man_options prints the section).
ll_test(NAME test_config SOURCES test_config.c LIBS ll_server LABELS unit)
add_executable(gen_man_options gen_man_options.c)
target_link_libraries(gen_man_options PRIVATE ll_server)
# LoRA adapters behind the server (stories260K): loaded by name, default, adapter=none|NAME equal
# to `llsrv generate --adapter`, mixed adapters in one batch, bad adapters refused, monitor field.
ll_script_test(NAME server_lora COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server_lora.py
  LABELS integration TIMEOUT 300)
# llsrv export: GGUF LoRA re-export, --merge (logits equal the adapter at run time), bad inputs.
ll_script_test(NAME lora_export COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_lora_cli.py
  LABELS integration TIMEOUT 300)
# The OpenAI-compatible HTTP API with real clients: the openai package (models, chat and
# completions streamed and not, logprobs, errors as SDK exceptions, adapters by model), curl
# (SSE framing, a disconnect freeing its slot), the bad-input battery (malformed JSON, wrong
# types, huge bodies, 1000 idle keep-alive connections, slow headers, HTTP/1.0, pipelining),
# /metrics through prometheus_client's parser. Makes a venv under the build directory once.
ll_script_test(NAME server_http COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_http.py
  LABELS integration TIMEOUT 600)
# OpenAI's fine-tuning API with the openai package on the demo model: upload (bad lines named),
# a job to success (events with the loss, checkpoints, its ft: model answering over HTTP and
# GEN adapter=), errors as SDK exceptions, cancel of a queued and a running job, a restart
# (store back, the model served again, a running job resumed), malformed multipart and
# oversized bodies. Same venv as server_http.
ll_script_test(NAME server_http_finetune COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_http_finetune.py
  LABELS integration TIMEOUT 600)
# Two replicas behind HAProxy (configs/haproxy.cfg, issue 33): health checks, sessions and HTTP
# requests spread over both, a replica killed mid-run takes only its own sessions down, the
# other answers everything after, the restarted replica comes back UP.
ll_script_test(NAME replicas_haproxy COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_replicas.py LABELS integration TIMEOUT 300)
# Adapters hot-loaded (issue 33): `adapter load/unload` on the monitor socket and adapter_dir,
# a new version served while a request streams on the old one, which it finishes on.
ll_script_test(NAME adapter_hotload COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_adapter_hotload.py LABELS integration TIMEOUT 300)
