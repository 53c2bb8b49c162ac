# The OpenCL backend on PoCL (or $LL_TEST_OPENCL_DEVICE): every kernel against the CPU backend,
# device-choice fallbacks, the binary cache; end to end, llsrv generate's greedy ids on OpenCL
# equal the CPU backend's (stories260K and SmolLM2).
ll_test(NAME test_opencl SOURCES test_opencl.c LIBS ll_kernels LABELS unit TIMEOUT 300)
ll_script_test(NAME opencl_generate COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_opencl_generate.sh
  LABELS integration TIMEOUT 600 FIXTURES smollm2)
