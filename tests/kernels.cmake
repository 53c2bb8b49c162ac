# kernels/: optimized kernels against scalar references; backend ops against formulas.
ll_test(NAME test_kernels SOURCES test_kernels.c LIBS ll_kernels LABELS unit TIMEOUT 120)
