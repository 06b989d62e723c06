#!/usr/bin/env bash
# bench/bundle_for_gpu_host.sh OUT_DIR BINARY...
#
# ../shared/tools/bundle-portable.sh (the binaries and the libraries `ldd` lists, for a GPU host
# without Debian's packages) plus OpenBLAS, which dlrec loads at run time (dlopen of
# libopenblas.so.0, src/nn/linear.cc) and `ldd` therefore does not list, with the libraries it
# needs. Then: source OUT_DIR/env.sh on the host.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OUT_DIR BINARY..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
tool=${BUNDLE_PORTABLE:-$here/../../shared/tools/bundle-portable.sh}
bash "$tool" "$@"
out=$1
blas=$(ldconfig -p | awk '/libopenblas\.so\.0 .*x86-64/{print $NF; exit}')
[[ -n $blas ]] || { echo "$0: libopenblas.so.0 not found (Debian: libopenblas0-pthread)" >&2; exit 1; }
cp -L "$blas" "$out/lib/libopenblas.so.0"
ldd "$blas" | awk '/=> \//{print $1, $3}' | while read -r name path; do
  [[ $name =~ ^(libc\.so|libm\.so|libgcc_s\.so|ld-linux|linux-vdso) ]] && continue
  [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name"
done
