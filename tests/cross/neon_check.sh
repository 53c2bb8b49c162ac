#!/usr/bin/env bash
# neon_check.sh - build the NEON kernels (kernels/cpu/dot_neon.c) for aarch64 with a cross
# compiler and run tests/cross/neon_dots.c under qemu-aarch64: every NEON dot must equal the
# scalar reference (dot.c) bit for bit. Twice: baseline armv8-a (vmull_s8 + vpadalq_s16) and
# armv8.2-a+dotprod (vdotq_s32), so both code paths are compiled with -Werror and run.
# Missing tools are a failure, not a skip: this is the only place NEON is tested on x86.
# Builds in a temporary directory; writes nothing into the tree.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CC="${LL_CROSS_CC:-aarch64-linux-gnu-gcc}"
QEMU="${LL_QEMU:-qemu-aarch64}"

missing=()
command -v "$CC" >/dev/null 2>&1 || missing+=("$CC (Debian: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)")
command -v "$QEMU" >/dev/null 2>&1 || missing+=("$QEMU (Debian: apt-get install qemu-user)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "neon_check: FAIL: missing tools:" >&2
  for m in "${missing[@]}"; do echo "  $m" >&2; done
  echo "neon_check: ./setup.sh installs them (PKGS)" >&2
  exit 1
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ll-neon.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# The smallest set: the test, the scalar reference + selection (dot.c), the NEON kernels, and
# formats/quant.c (fp16 conversions, row sizes, reference quantizers; only libc/libm).
srcs=("$src/tests/cross/neon_dots.c" "$src/kernels/cpu/dot.c" "$src/kernels/cpu/dot_neon.c" "$src/formats/quant.c")
# Same language mode and defines as the CMake build (ISO C11, so no fp contraction: the
# reference and the NEON float steps compile the same way in both).
cflags=(-std=c11 -O2 -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -fno-strict-aliasing -D_GNU_SOURCE
        -I"$src/kernels/cpu" -I"$src/kernels" -I"$src/formats")

"$CC" --version | head -n1
"$QEMU" --version | head -n1
rc=0
for march in armv8-a armv8.2-a+dotprod; do
  exe="$tmp/neon_dots-${march//[^a-z0-9.]/_}"
  echo "== -march=$march"
  "$CC" "${cflags[@]}" -march="$march" -static -o "$exe" "${srcs[@]}" -lm
  # A machine model that has the dot-product extension (qemu's default "max" does; say so).
  if "$QEMU" -cpu max "$exe"; then :; else rc=1; echo "neon_check: FAIL at -march=$march" >&2; fi
done
[ $rc -eq 0 ] && echo "neon_check: OK (both NEON paths bit-identical to the scalar reference)"
exit $rc
