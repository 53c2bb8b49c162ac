# The embedded default model: state directory, demo.ckpt created once, engine + byte tokenizer.
ll_test(NAME test_demo SOURCES test_demo.c LIBS ll_server LABELS unit TIMEOUT 120)
