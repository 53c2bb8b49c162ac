# kernels/: optimized kernels against scalar references; backend ops against formulas.
ll_test(NAME test_kernels SOURCES test_kernels.c LIBS ll_kernels LABELS unit TIMEOUT 120)
# training members: backward ops vs finite differences, fast versions vs scalar references
ll_test(NAME test_train_kernels SOURCES test_train_kernels.c LIBS ll_kernels LABELS unit TIMEOUT 120)
# not a test: GFLOP/s of the training members at SmolLM2's shapes next to sgemm's peak
add_executable(train_kernels_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/train_kernels_bench.c)
target_link_libraries(train_kernels_bench PRIVATE ll_kernels)
# not a test: the machine's read bandwidth (1..N threads), named beside every speed figure
add_executable(readbw ${CMAKE_CURRENT_SOURCE_DIR}/bench/readbw.c)
target_link_libraries(readbw PRIVATE Threads::Threads)
# `make bench` builds what the benchmarks under tests/bench/ run (see docs/PERFORMANCE.md)
add_custom_target(bench DEPENDS llsrv train_kernels_bench readbw)
# test_kernels again with the AVX2 kernels pinned (LL_CPU_ISA=avx2): on AVX-512 machines the backend's
# batched matmuls (tiles, side tables, ragged tails) otherwise never reach the AVX2 tiles. And with
# the packed decode kernels' prefetch on (LL_CPU_PREFETCH=1; by default only CPUs without AVX-512
# prefetch), so every machine runs both.
add_test(NAME test_kernels_avx2 COMMAND test_kernels)
set_tests_properties(test_kernels_avx2 PROPERTIES TIMEOUT 120 LABELS unit ENVIRONMENT "${LL_TEST_ENV};LL_CPU_ISA=avx2;LL_CPU_PREFETCH=1")
# The CPU fallback when a vendor's OpenCL library is installed without its ICD file: the
# reason names the library and the fix (llsrv plan, the server's start-up summary).
ll_script_test(NAME opencl_icd_hint COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_icd_hint.sh LABELS integration)
