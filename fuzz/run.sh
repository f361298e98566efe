#!/usr/bin/env bash
# The fuzz lane (docs/fuzzing.md). It builds libjpeg-turbo 2.1.5 and fastpipe's plain extensions
# (_jpeg, _resize, _png; _io too, which no target calls) with AddressSanitizer and
# UndefinedBehaviorSanitizer into fuzz/.build (the installed package untouched), writes the seed
# corpus (with the shared findings of tests/jpeg/cases), and replays every seed through the
# native targets. Then SECONDS_TO_FUZZ seconds of mutational fuzzing (default 120), each half
# run only if all before it passed: half on the native targets (the sanitized _jpeg, _resize and
# _png) with the sanitizer runtimes preloaded, half on the Python layers around the installed
# extensions without the preload (Python over h5py, lmdb, tarfile and Pillow). There each
# execution draws one of three groups, so about a third each goes to damaged packs, to the PNG
# paths around fastpipe._png (refused at the start if fastpipe._png is not installed: they would
# compare Pillow with itself), and to the sources (tar shards and their indexes, users' plain
# HDF5 files). Fails on any finding, sanitizer report or hang; findings land in fuzz/findings/.
#   fuzz/run.sh                       # CI's bounded run
#   SECONDS_TO_FUZZ=3600 fuzz/run.sh  # a longer one
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
seconds="${SECONDS_TO_FUZZ:-120}"
python_seconds=$((seconds / 2))
native_seconds=$((seconds - python_seconds))
build=fuzz/.build
python=${PYTHON:-python}

bash fuzz/build_libjpeg.sh
prefix="$PWD/$build/libjpeg"
t=$SECONDS
FASTPIPE_SANITIZE=address,undefined FASTPIPE_NO_CUDA=1 FASTPIPE_LIBJPEG_PREFIX="$prefix" \
    "$python" setup.py -q build_ext --build-lib "$build/lib" --build-temp "$build/temp" \
    >"$build/extensions.log" 2>&1 \
    || { tail -40 "$build/extensions.log"; echo "the sanitizer build of fastpipe._jpeg/_resize/_png failed"; exit 1; }
echo "sanitized fastpipe._jpeg, _resize and _png built in $((SECONDS - t)) s"

rm -rf "$build/corpus"
"$python" -m fuzz.corpus "$build/corpus" --jpegtran "$prefix/bin/jpegtran" \
    --extra tests/jpeg/cases ${FUZZ_EXTRA:-}

# Python itself is not instrumented: the ASan runtime is preloaded, leaks are not checked (the
# interpreter keeps its objects), and the first report ends the process with a non-zero status.
export LD_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86:max_allocation_size_mb=2048:allocator_may_return_null=0:malloc_fill_byte=171"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87"
status=0
"$python" -m fuzz.harness --lib "$build/lib" --replay "$build"/corpus/* || status=$?
if [ "$status" = 0 ]; then
    "$python" -m fuzz.harness "$build/corpus" --lib "$build/lib" --seconds "$native_seconds" \
        --findings fuzz/findings || status=$?
fi
unset LD_PRELOAD
if [ "$status" = 0 ]; then
    "$python" -m fuzz.harness "$build/corpus" --targets python --seconds "$python_seconds" \
        --findings fuzz/findings || status=$?
fi
if [ "$status" != 0 ]; then
    echo "fuzz lane FAILED (status $status): see the report above and fuzz/findings/"
    exit 1
fi
echo "fuzz lane finished in $((SECONDS - start)) s"
