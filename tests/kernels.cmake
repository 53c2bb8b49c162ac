# kernels/: optimized kernels against scalar references; backend ops against formulas.
ll_test(NAME test_kernels SOURCES test_kernels.c LIBS ll_kernels LABELS unit TIMEOUT 120)
# training members: backward ops vs finite differences, fast versions vs scalar references
ll_test(NAME test_train_kernels SOURCES test_train_kernels.c LIBS ll_kernels LABELS unit TIMEOUT 120)
