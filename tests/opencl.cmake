# The OpenCL backend on PoCL (or $LL_TEST_OPENCL_DEVICE): every kernel against the CPU backend
# (training members against the CPU's scalar references), also built as for a device without f64,
# device-choice fallbacks, the binary cache, the fast tier within stated tolerances; end to end,
# llsrv generate's greedy ids on OpenCL (reference tier) equal the CPU backend's (stories260K and
# SmolLM2), and both tiers' launches and bytes per decode step.
# (TIMEOUT: PoCL compiles the program twice - with and without f64 - on a first run after the
# kernels change: about 2.5 min on two busy cores, 9.3 min at load average 26 with train_fast.cl
# added (2026-11-27); seconds once its cache has them.)
ll_test(NAME test_opencl SOURCES test_opencl.c LIBS ll_server LABELS unit TIMEOUT 1200) # ll_server: the host sampler, sample's reference
# The fast tier's integer-dot decode products (llsrv_dot.cl) against the CPU backend (its bits
# where a block a work item keeps them, on PoCL), and LL_OPENCL_DOT's choice behind the probe:
# forced ptx / khr on a device without them fall back to the portable dots, saying why (seconds
# once PoCL's cache holds the main program).
ll_test(NAME test_opencl_dot SOURCES test_opencl_dot.c LIBS ll_kernels LABELS unit TIMEOUT 600)
# The fast tier's training kernels (train_fast.cl) against the CPU's scalar references, stated
# tolerances (issue 30).
ll_test(NAME test_opencl_train_fast SOURCES test_opencl_train_fast.c LIBS ll_kernels LABELS unit TIMEOUT 1200)
# not a test: the fast tier's training attention, probabilities kept vs flash-style (ms per call)
add_executable(opencl_attn_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/opencl_attn_bench.c)
target_link_libraries(opencl_attn_bench PRIVATE ll_kernels)
# The fast tier (LL_OPENCL_REFERENCE=0) end to end on SmolLM2 against the CPU, teacher-forced:
# perplexity and top-1 agreement no farther from the CPU's than a control's (the reference tier
# without f64: issue 29's 0.1% / 99% are below SmolLM2's noise floor, see the test), a decode
# step at most 6 launches per layer and 64 bytes back (about 1 min on two cores: slow).
ll_test(NAME test_opencl_fast SOURCES test_opencl_fast.c LIBS ll_server LABELS "integration;slow" TIMEOUT 600 FIXTURES smollm2)
# Decode steps queued one behind the other (ll_engine_decode_queue) on stories260K: the same greedy
# and seeded sampled ids as step by step, no wait with the device idle but the last, a stop's
# queued step undone (length, KV blocks, continuation), refusals, LL_OPENCL_QUEUE_AHEAD=0 (seconds).
ll_test(NAME test_opencl_queue SOURCES test_opencl_queue.c LIBS ll_server LABELS unit TIMEOUT 300)
ll_script_test(NAME opencl_generate COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_opencl_generate.sh
  LABELS integration TIMEOUT 600 FIXTURES smollm2)
# The server with decode steps queued one behind the other against one at a time
# (LL_OPENCL_QUEUE_AHEAD=0): seeded sampled texts of two requests sharing a batch, a stop
# string's end, a request after sequences freed with a step queued past their end (~1 min).
ll_script_test(NAME opencl_server_queue COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_opencl_server_queue.py
  LABELS integration TIMEOUT 600 FIXTURES smollm2)
# The server on the OpenCL device (PoCL): 16 concurrent clients' greedy outputs equal the
# single-client ones and `llsrv generate --device cpu` (about 1 min on two cores: slow).
ll_script_test(NAME server_smollm2_opencl COMMAND ${CMAKE_COMMAND} -E env LL_TEST_DEVICE=opencl:0:0
  python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_server_smollm2.py
  LABELS "integration;slow" TIMEOUT 900 FIXTURES smollm2)
# Training on the OpenCL device: `llsrv train` (full-parameter, LoRA with dropout, LoRA on Q4_1) gives the
# CPU backend's per-step loss curve within 1e-3 relative, stderr naming the device; the fast tier
# (LL_OPENCL_REFERENCE=0) too, and a fast-tier run resumed from its checkpoint continues the
# uninterrupted run's curve (~30 s once PoCL's cache holds both tiers' programs).
ll_script_test(NAME opencl_train COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_opencl_train.sh
  LABELS integration TIMEOUT 300)
# The server's background trainer on the OpenCL serving device: its own instance, named in the
# start-up summary and the monitor, steps and a checkpoint, GEN answered while it trains; with
# the trainer's instance failed (LL_OPENCL_FAULT=train), the CPU fallback says why and its
# losses equal the device's within 1e-3; a device too full for a run's buffers
# (LL_OPENCL_FAULT=train_alloc) trains on the CPU; full-parameter training on the device too (~10 s).
ll_script_test(NAME opencl_server_train COMMAND python3 -u ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_opencl_server_train.py
  LABELS integration TIMEOUT 300)
# The fast tier's split-K decode attention (llsrv_split.cl) against the CPU: caches of 1 .. 2900
# positions in one batch, grouped-query heads, windows, f16 and f32 caches; one launch, the
# split path taken where it should be, attn_fast's bits where a block does not split (seconds).
ll_test(NAME test_opencl_splitk SOURCES test_opencl_splitk.c LIBS ll_kernels LABELS unit TIMEOUT 1200)
