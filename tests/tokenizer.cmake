# Tokenizers: llama.cpp conformance vectors (../shared), round trips, streaming, SmolLM2's vocabulary.
ll_test(NAME test_tokenizer SOURCES test_tokenizer.c LIBS ll_formats LABELS unit TIMEOUT 120 FIXTURES smollm2)
# The CLI: `llsrv tokenize --no-bos` prints a vector file's ids exactly as its .out line.
ll_script_test(NAME tokenize_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_tokenize_cli.sh
  LABELS integration TIMEOUT 120 FIXTURES smollm2)
# llama.cpp 0c1e5709's test vocabularies (16 MB and more: fetched once into the cache, sha256
# checked) against the vectors committed in tests/data/vocab.
add_test(NAME fetch_llama_vocab COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fetch-llama-vocab.sh)
set_tests_properties(fetch_llama_vocab PROPERTIES FIXTURES_SETUP llama_vocab TIMEOUT 600
  LABELS "integration" ENVIRONMENT "${LL_TEST_ENV}")
ll_script_test(NAME tokenizer_llama_vocab COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_llama_vocab.sh
  LABELS integration TIMEOUT 300 FIXTURES llama_vocab)
