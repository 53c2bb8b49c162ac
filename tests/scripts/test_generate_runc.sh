#!/usr/bin/env bash
# `llsrv generate` on llama2.c's stories260K as a user first runs it (no KV flag, greedy):
# all 256 ids equal llama2.c run.c's (tests/ref/stories260K_greedy256.ids), because a llama2.c
# model defaults to run.c's f32 KV cache (test_engine checks that an explicit choice wins).
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
M=$LL_SHARED_DIR/testdata/models/stories260K.bin
REF=$LL_SOURCE_DIR/tests/ref/stories260K_greedy256.ids
if [ ! -f "$M" ]; then echo "FAIL: $M is missing (../shared/testdata)"; exit 1; fi
want=$(tr -s ' \n' ' ' < "$REF" | sed 's/ $//')
got=$("$LLSRV" generate --model "$M" --ids -n 256 --temp 0 -t 1 2>/dev/null | tr -s ' \n' ' ' | sed 's/ $//')
if [ "$got" = "$want" ]; then echo "ok: generate with no KV flag: 256 ids equal run.c's"; exit 0; fi
echo "FAIL: generate with no KV flag differs from run.c:"; echo " got  [$got]"; echo " want [$want]"
exit 1
