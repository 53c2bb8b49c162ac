# .ckpt container (formats/ckpt.c) and `llsrv convert` (server/cmd/cmd_convert.c).
ll_test(NAME test_ckpt SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt.c LABELS unit TIMEOUT 120)
# Crash safety: one in-writer kill per shard + 120 random SIGKILLs of a child writing over a
# valid file; after each, the path holds exactly the old or the new checkpoint.
ll_test(NAME test_ckpt_kill SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_kill.c
        LABELS integration TIMEOUT 300 ARGS 120)
# `llsrv convert`: synthetic model with each --quant (error bounds), SmolLM2 GGUF -> .ckpt ->
# GGUF byte-identical, SmolLM2 with each --quant.
ll_test(NAME test_ckpt_convert SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_convert.c
        LIBS ll_server LABELS integration TIMEOUT 600 FIXTURES smollm2)
