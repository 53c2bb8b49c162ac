# The inference engine: llama2.c reference ids, batching, KV accounting, sampler; SmolLM2
# against llama.cpp's references (tests/ref/).
ll_test(NAME test_engine SOURCES test_engine.c LIBS ll_server LABELS unit TIMEOUT 300)
ll_script_test(NAME engine_smollm2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_engine_smollm2.sh
  LABELS integration TIMEOUT 600 FIXTURES smollm2)
# LoRA adapters: creation, GGUF/PEFT import and export, per-sequence application, bad adapters.
ll_test(NAME test_lora SOURCES test_lora.c LIBS ll_server LABELS unit TIMEOUT 120)
