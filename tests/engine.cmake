# The inference engine: llama2.c reference ids, batching, KV accounting, sampler; SmolLM2
# against llama.cpp's references (tests/ref/).
ll_test(NAME test_engine SOURCES test_engine.c LIBS ll_server LABELS unit TIMEOUT 300)
ll_script_test(NAME engine_smollm2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_engine_smollm2.sh
  LABELS integration TIMEOUT 600 FIXTURES smollm2)
# LoRA adapters: creation, GGUF/PEFT import and export, per-sequence application, bad adapters.
ll_test(NAME test_lora SOURCES test_lora.c LIBS ll_server LABELS unit TIMEOUT 120)
# The CLI with no KV flag on a llama2.c model: run.c's 256 greedy ids (f32 cache by default).
# Registered where the shared llama2.c model is (it is not part of the repository).
if(EXISTS "${LL_SHARED_DIR}/testdata/models/stories260K.bin")
  ll_script_test(NAME generate_runc COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_generate_runc.sh
    LABELS integration TIMEOUT 300)
endif()
# SmolLM2 with a deterministic LoRA adapter: greedy ids equal llama.cpp --lora's (tests/ref).
ll_script_test(NAME lora_smollm2 COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_lora_smollm2.py
  LABELS integration TIMEOUT 600 FIXTURES smollm2)
# Mixture of experts: routing against a double-precision reference, experts that are all one
# dense FFN against that dense model, prompt (grouped experts) against decode, batch invariance,
# bad MoE files, LoRA gradients through the experts against finite differences (with LoRA dropout
# on the experts' adapters too).
ll_test(NAME test_moe SOURCES test_moe.c LIBS ll_server LABELS unit TIMEOUT 120)
# The same binary on the OpenCL device (PoCL): LoRA (attention + every expert, dropout 0.1) and full-parameter
# training of each MoE layout against the CPU's - one forward/backward's gradient (the routed
# experts' backward, the router's, the shared expert's) within 1e-5 of max |g|, then 6 steps'
# losses, aux losses and validation losses within 1e-5 relative on the reference tier
# (LL_OPENCL_REFERENCE=1; observed <= 1e-7) and 1e-3 on the fast tier (observed <= 4e-7); ~12 s,
# more when PoCL compiles the programs first (TIMEOUT as test_opencl's).
add_test(NAME test_moe_opencl COMMAND test_moe opencl:0:0)
set_tests_properties(test_moe_opencl PROPERTIES TIMEOUT 1200 LABELS unit ENVIRONMENT "${LL_TEST_ENV}")
# Mixture-of-experts layouts (Mixtral's llama, qwen2moe, qwen3moe, olmoe) written by the gguf
# package: 32 greedy ids on 4 prompts equal llama.cpp's (tests/ref/moe_greedy32.tsv), top-5
# logits within 1e-3, the OpenCL device's ids (PoCL, reference tier) equal the CPU's; the same
# with a LoRA adapter on attention and every expert, and on qwen2moe's shared expert
# (tests/ref/moe_lora_greedy32.tsv).
ll_script_test(NAME moe_ref COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_moe_ref.py
  LABELS integration TIMEOUT 600)
