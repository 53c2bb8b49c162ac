# The training data pipeline: packing and loss targets, files and .gitignore, JSONL, split, cursor.
ll_test(NAME test_data SOURCES test_data.c LIBS ll_server LABELS unit TIMEOUT 120)
# The same with SmolLM2's BPE vocabulary and chatml template (the masks line up with its tokens).
ll_test(NAME test_data_smollm2 SOURCES test_data.c LIBS ll_server LABELS unit TIMEOUT 120 ARGS smollm2 FIXTURES smollm2)
