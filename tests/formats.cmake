# formats/: quant blocks, GGUF reader/writer, llama2.c and safetensors readers.
ll_test(NAME test_quant SOURCES test_quant.c LIBS ll_formats LABELS unit TIMEOUT 120)
ll_test(NAME test_gguf SOURCES test_gguf.c LIBS ll_formats LABELS unit TIMEOUT 120 FIXTURES smollm2)
ll_test(NAME test_readers SOURCES test_readers.c LIBS ll_formats LABELS unit TIMEOUT 120)
