#!/usr/bin/env bash
# fastpipe's GPU kit in one command, for a CUDA machine without network access (docs/gpu.md).
#
#   bash scripts/gpu-kit.sh [RESULTS_DIR] [--quick] [--no-build]
#
# Run from the repository root, in an environment with a CUDA build of torch, nvcc of the same
# CUDA major version, setuptools and pytest. When the bundle of ../shared/gpu-offline/prepare.sh
# is there (.gpu/whl/*.whl, .gpu/deb/*.deb: the small wheels such machines lack, libjpeg-turbo's
# headers), it is installed into /tmp/fp-site and /tmp/fp-jpeg first, without network.
#
# Steps, each run even when an earlier one failed, each writing into RESULTS_DIR (default
# gpu-results):
#   env.txt          date, nvidia-smi, nvcc --version, Python, torch, the relevant packages
#   build.log        pip install -e . for THIS machine's GPU architectures only (fast)
#   doctor.json/.txt fastpipe doctor --json, and the screen version
#   cuda-lane.log/.xml  FASTPIPE_REQUIRE_CUDA=1 pytest -m cuda tests/cuda (the whole lane: every
#                    test marked cuda lives there, tests/cuda/test_lane_collection.py holds it;
#                    so a test module elsewhere that needs a package this machine lacks cannot
#                    stop the lane's collection)
#   cpu-checks.log   the CUDA code's checks that need no GPU but nvcc (tests/ops/test_cuda_*.py)
#   bench.log/.json  fastpipe bench --device cuda --batch-size 128 --workers min(cores, 8)
#                    (KIT_BENCH_ARGS replaces those two options)
#   summary.txt      one line per step: ok, failed (exit code), skipped, or "no GPU"
# --quick skips the CPU checks and the benchmark; --no-build uses the installed fastpipe.
# Without a GPU the CUDA steps (build, lane, bench) report "no GPU" and the kit still runs to
# the end (exit 0): that is what the CPU test of the kit checks (tests/cuda/test_gpu_kit.py).
# The exit code is the first failed step's.
set -uo pipefail

out=gpu-results; quick=0; build=1
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    --no-build) build=0 ;;
    -*) echo "gpu-kit.sh: unknown option $arg" >&2; exit 2 ;;
    *) out=$arg ;;
  esac
done
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
py=${PYTHON:-python3}
summary="$out/summary.txt"
: > "$summary"
rc=0

# step NAME COMMAND...: runs it, logs the outcome in summary.txt, keeps the first failure's code.
step() {
  local name=$1; shift
  echo "== $name"
  local started=$SECONDS
  "$@"
  local r=$?
  local took=$((SECONDS - started))
  if [[ $r -eq 0 ]]; then
    echo "$name: ok (${took} s)" >> "$summary"
  else
    echo "$name: failed, exit $r (${took} s)" >> "$summary"
    [[ $rc -eq 0 ]] && rc=$r
  fi
  echo "== $name: exit $r"
  return 0
}
no_gpu() { echo "$1: no GPU (torch sees no CUDA device): not run" | tee -a "$summary"; }
skipped() { echo "$1: skipped ($2)" | tee -a "$summary"; }

# The offline bundle, when prepare.sh made one.
if ls .gpu/whl/*.whl > /dev/null 2>&1; then
  mkdir -p /tmp/fp-site
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp-site .gpu/whl/*.whl
  export PYTHONPATH=/tmp/fp-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ls .gpu/deb/*.deb > /dev/null 2>&1; then
  mkdir -p /tmp/fp-jpeg
  for deb in .gpu/deb/*.deb; do dpkg -x "$deb" /tmp/fp-jpeg; done
  lib=$(dirname "$(find /tmp/fp-jpeg -name 'libjpeg.so*' | head -1)")
  [[ ! -e $lib/libjpeg.so ]] && ln -s "$(ls "$lib"/libjpeg.so.* | head -1)" "$lib/libjpeg.so"
  export CFLAGS="-I/tmp/fp-jpeg/usr/include -I/tmp/fp-jpeg/usr/include/x86_64-linux-gnu ${CFLAGS:-}"
  export LDFLAGS="-L$lib -Wl,-rpath,$lib ${LDFLAGS:-}"
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONUNBUFFERED=1

# This machine's GPU architectures ("9.0", or "8.0;9.0" with mixed GPUs); empty without a GPU.
archs=$($py - 2>/dev/null <<'EOF'
import torch
if torch.cuda.is_available():
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    print(";".join(f"{major}.{minor}" for major, minor in caps))
EOF
)

{
  date -u
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 || echo "nvcc: not found"
  $py -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"
  echo "GPU architectures: ${archs:-none}"
  $py -m pip list 2>/dev/null | grep -Ei 'torch|dali|nvimgcodec|timm|lightning|accelerate|h5py|numpy|simplejpeg|pytest|nvidia-ml'
} > "$out/env.txt" 2>&1

if [[ -z $archs ]]; then
  no_gpu build
elif [[ $build == 0 ]]; then
  skipped build "--no-build: the installed fastpipe is used"
else
  # One architecture per GPU model present: minutes less than the default list of eight.
  step build env TORCH_CUDA_ARCH_LIST="$archs" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    $py -m pip install --no-build-isolation --no-deps --no-index -e . > "$out/build.log" 2>&1
fi

step doctor bash -c "$py -m fastpipe doctor --json > '$out/doctor.json' 2>&1 && \
  $py -m fastpipe doctor > '$out/doctor.txt' 2>&1"

if [[ -z $archs ]]; then
  no_gpu cuda-lane
else
  step cuda-lane env FASTPIPE_REQUIRE_CUDA=1 FASTPIPE_REQUIRE_EXTENSION=1 \
    $py -m pytest -m cuda -p no:cacheprovider -rA -v --junitxml="$out/cuda-lane.xml" tests/cuda \
    > "$out/cuda-lane.log" 2>&1
fi

if [[ $quick == 1 ]]; then
  skipped cpu-checks "--quick"
else
  step cpu-checks $py -m pytest -p no:cacheprovider -q -ra tests/ops/test_cuda_build.py \
    tests/ops/test_cuda_fast_path.py tests/ops/test_cuda_archs.py > "$out/cpu-checks.log" 2>&1
fi

if [[ $quick == 1 ]]; then
  skipped bench "--quick"
elif [[ -z $archs ]]; then
  no_gpu bench
else
  # The bench's sample images are generated once (single-threaded, cached) and must number at
  # least 3 x batch x workers: batch 128 and at most 8 workers keep that to 3,072 images, so the
  # generation leaves the bench's 9-minute budget to the loaders. KIT_BENCH_ARGS replaces them.
  bench_args=${KIT_BENCH_ARGS:-"--batch-size 128 --workers $(( $(nproc) < 8 ? $(nproc) : 8 ))"}
  # shellcheck disable=SC2086 # bench_args holds several options
  step bench $py -m fastpipe bench --device cuda --no-progress --save "$out/bench.json" \
    $bench_args > "$out/bench.log" 2>&1
fi

echo
cat "$summary"
[[ -f $out/cuda-lane.log ]] && tail -n 3 "$out/cuda-lane.log"
echo "results: $out (send the whole folder back: docs/gpu.md)"
exit $rc
