#!/usr/bin/env bash
# cmake --install puts the binaries, the man pages and the example configs where users look.
set -u
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
fail=0 pass=0
cmake --install "$LL_BINARY_DIR" --prefix "$prefix" >/dev/null || { echo "cmake --install failed"; exit 1; }
# The documented pages and example configs must install; every page in man/ must land in its section.
for f in bin/llsrv bin/lltop share/man/man1/llsrv.1 share/man/man1/lltop.1 share/man/man5/llsrv-ckpt.5 share/man/man5/llsrv.yaml.5 \
         share/man/man7/llsrv-protocol.7 share/man/man7/llsrv-http.7 share/llsrv/configs/server.yaml share/llsrv/configs/lora.yaml \
         share/llsrv/configs/demo.yaml share/llsrv/configs/haproxy.cfg \
         $(cd "$LL_SOURCE_DIR/man" && for m in *.[157]; do echo "share/man/man${m##*.}/$m"; done); do
  if [ -e "$prefix/$f" ]; then pass=$((pass+1)); else echo "missing after install: $f"; fail=$((fail+1)); fi
done
# Every installed man page is well-formed roff (man's own checker).
if command -v groff >/dev/null; then
  for m in "$prefix"/share/man/man*/*; do
    if groff -man -Tutf8 -ww -z "$m" 2>&1 | grep -q .; then echo "roff warnings in $m:"; groff -man -Tutf8 -ww -z "$m"; fail=$((fail+1)); else pass=$((pass+1)); fi
  done
fi
# The installed configs are accepted by the installed binary.
for y in "$prefix"/share/llsrv/configs/*.yaml; do
  "$prefix/bin/llsrv" --config "$y" --check-config >/dev/null 2>&1 && pass=$((pass+1)) || { echo "--check-config $y failed"; fail=$((fail+1)); }
done
# The installed HAProxy config parses (haproxy is in setup.sh's packages).
haproxy -c -f "$prefix/share/llsrv/configs/haproxy.cfg" >/dev/null 2>&1 && pass=$((pass+1)) || { echo "haproxy -c configs/haproxy.cfg failed"; fail=$((fail+1)); }
"$prefix/bin/llsrv" --version | grep -q '^llsrv ' && pass=$((pass+1)) || { echo "llsrv --version"; fail=$((fail+1)); }
"$prefix/bin/lltop" --version | grep -q '^lltop ' && pass=$((pass+1)) || { echo "lltop --version"; fail=$((fail+1)); }
# The installed lltop says plainly that no server listens (non-zero exit).
if "$prefix/bin/lltop" --once --socket "$prefix/none.sock" >/dev/null 2>"$prefix/lltop.err"; then
  echo "lltop --once without a server exited 0"; fail=$((fail+1))
else
  grep -q 'no llsrv listening' "$prefix/lltop.err" && pass=$((pass+1)) || { echo "lltop --once message: $(cat "$prefix/lltop.err")"; fail=$((fail+1)); }
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
