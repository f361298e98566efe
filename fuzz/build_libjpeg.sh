#!/usr/bin/env bash
# Builds libjpeg-turbo 2.1.5 (Debian bookworm's libjpeg62-turbo, with Debian's patches) with
# AddressSanitizer and UndefinedBehaviorSanitizer into $PREFIX (default fuzz/.build/libjpeg),
# from Debian's source package, checked against the SHA-256 sums of its signed .dsc.
# SIMD is off: its assembly is not instrumented (and needs nasm), so a sanitized build without it
# checks all of libjpeg's C code. Used by fuzz/run.sh; prints the seconds it took.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
PREFIX="${PREFIX:-$here/.build/libjpeg}"
work="$here/.build/src"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/libj/libjpeg-turbo"
orig=libjpeg-turbo_2.1.5.orig.tar.gz
orig_sha=254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c
deb=libjpeg-turbo_2.1.5-2.debian.tar.xz
deb_sha=cdb2433c2f7101345c1ffa14efb943787c675b86354691a32490845fe4bc9237
start=$SECONDS

if [ -f "$PREFIX/lib/libjpeg.so" ] && [ -z "${FORCE:-}" ]; then
    echo "sanitized libjpeg-turbo already in $PREFIX (FORCE=1 rebuilds)"
    exit 0
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
for f in "$orig:$orig_sha" "$deb:$deb_sha"; do
    name="${f%%:*}" sum="${f##*:}"
    curl -sSfL --retry 3 -o "$name" "$mirror/$name"
    echo "$sum  $name" | sha256sum -c --quiet -
done
tar xzf "$orig"
cd libjpeg-turbo-2.1.5
tar xJf "../$deb"
while read -r patch; do
    case "$patch" in ''|'#'*) continue ;; esac
    patch -p1 -s < "debian/patches/$patch"
done < debian/patches/series
# No slop in libjpeg's small-object pools: each object then ends at its own allocation, so that
# AddressSanitizer sees a write past one (jinit_upsampler's past the merged upsampler's, reached
# through jpeg_crop_scanline) instead of it landing inside the pool.
perl -0pi -e 's/(first_pool_slop\[JPOOL_NUMPOOLS\] = \{)[^}]*\}/$1 0, 0 }/; s/(extra_pool_slop\[JPOOL_NUMPOOLS\] = \{)[^}]*\}/$1 0, 0 }/' jmemmgr.c
grep -q 'first_pool_slop\[JPOOL_NUMPOOLS\] = { 0, 0 }' jmemmgr.c

flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
cmake -S . -B build -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR="$PREFIX/lib" -DWITH_SIMD=0 -DWITH_TURBOJPEG=0 \
    -DWITH_JPEG8=0 -DENABLE_STATIC=0 -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
cmake --install build >/dev/null
echo "sanitized libjpeg-turbo 2.1.5 in $PREFIX, built in $((SECONDS - start)) s"
