# Tokenizers: llama.cpp conformance vectors, round trips, streaming, SmolLM2's vocabulary.
ll_test(NAME test_tokenizer SOURCES test_tokenizer.c LIBS ll_formats LABELS unit TIMEOUT 120 FIXTURES smollm2)
# The CLI: `llsrv tokenize --no-bos` prints a vector file's ids exactly as its .out line.
ll_script_test(NAME tokenize_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_tokenize_cli.sh
  LABELS integration TIMEOUT 120 FIXTURES smollm2)
