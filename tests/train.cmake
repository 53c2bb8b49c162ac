# The trainer: whole-model gradients against finite differences (LoRA and full), recomputation,
# loss falling on a tiny corpus, resume equal to the uninterrupted run, NaN skip, bad parameters.
ll_test(NAME test_trainer SOURCES test_trainer.c LIBS ll_server LABELS unit TIMEOUT 120)
