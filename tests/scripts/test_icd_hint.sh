#!/usr/bin/env bash
# A GPU machine whose driver ships its OpenCL library without the ICD file (NVIDIA's images
# often do): the CPU fallback line names the library and the one-line fix, in `llsrv plan` and
# in the server's start-up summary; no hint once an ICD file names the library, nor without the
# library. The loader is pointed at a private vendors directory (OCL_ICD_VENDORS) and the
# library is an empty stand-in found through LD_LIBRARY_PATH.
set -u
LLSRV=$LL_BINARY_DIR/server/llsrv
pass=0 fail=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*"; fail=$((fail+1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/libs" "$tmp/vendors" "$tmp/none"
: > "$tmp/libs/libnvidia-opencl.so.1"
"$LLSRV" init --preset tiny -o "$tmp/m.ckpt" >/dev/null 2>&1 || bad "llsrv init"

out=$(OCL_ICD_VENDORS=$tmp/vendors LD_LIBRARY_PATH=$tmp/libs "$LLSRV" plan --model "$tmp/m.ckpt" 2>&1)
if grep -q "NVIDIA's OpenCL library $tmp/libs/libnvidia-opencl.so.1 is installed but no ICD file in $tmp/vendors names it" <<<"$out" &&
   grep -qF "echo libnvidia-opencl.so.1 > $tmp/vendors/nvidia.icd" <<<"$out"; then ok; else bad "plan: no ICD hint: $out"; fi

# The server's start-up summary says the same.
OCL_ICD_VENDORS=$tmp/vendors LD_LIBRARY_PATH=$tmp/libs "$LLSRV" --model "$tmp/m.ckpt" --listen 127.0.0.1:0 --http off \
  --socket "$tmp/run/m.sock" --state-dir "$tmp/state" --parallel 1 --ctx 64 >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "listening on" "$tmp/serve.log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -TERM $pid 2>/dev/null; wait $pid
if grep -q "device .*nvidia.icd" "$tmp/serve.log"; then ok; else bad "start-up summary: no ICD hint: $(cat "$tmp/serve.log")"; fi

# An ICD file names the library (the stand-in cannot load, so there is still no platform): no hint.
echo "libnvidia-opencl.so.1" > "$tmp/vendors/nvidia.icd"
out=$(OCL_ICD_VENDORS=$tmp/vendors LD_LIBRARY_PATH=$tmp/libs "$LLSRV" plan --model "$tmp/m.ckpt" 2>&1)
if grep -q "cpu: no OpenCL" <<<"$out" && ! grep -q "is installed but" <<<"$out"; then ok; else bad "hint despite the ICD file: $out"; fi
# No vendor library anywhere: no hint either.
out=$(OCL_ICD_VENDORS=$tmp/none LD_LIBRARY_PATH=$tmp/none "$LLSRV" plan --model "$tmp/m.ckpt" 2>&1)
if grep -q "cpu: no OpenCL platform" <<<"$out" && ! grep -q "is installed but" <<<"$out"; then ok; else bad "hint without a library: $out"; fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
