#!/usr/bin/env bash
# fastpipe's GPU kit in one command, for a CUDA machine without network access (docs/gpu.md).
#
#   bash scripts/gpu-kit.sh [RESULTS_DIR] [--quick | --bench-only] [--no-build] [--gpu-decode]
#
# Run from the repository root, in an environment with a CUDA build of torch, nvcc of the same
# CUDA major version, setuptools and pytest. When the bundle of ../shared/gpu-offline/prepare.sh
# is there (.gpu/whl/*.whl, .gpu/deb/*.deb: the small wheels such machines lack, libjpeg-turbo's
# headers), it is installed into /tmp/fp-site and /tmp/fp-jpeg first, without network; so are
# nvImageCodec and nvJPEG from .gpu-nvimg/*.whl (the same script bundles them there), which GPU
# decode (decode="gpu") needs. KIT_BUNDLE names the folder that holds .gpu and .gpu-nvimg
# (default: the repository root, where prepare.sh writes them).
#
# RESULTS_DIR (default gpu-results) receives two files, rewritten after every step, so that a run
# cut short still returns what it did: summary.txt (one line per step: ok, failed (exit code),
# timed out, skipped, or "no GPU") and gpu-results.tgz, every log in a folder gpu-results/:
#   env.txt          date, nvidia-smi, nvcc --version, Python, torch, the relevant packages
#   bundle.log       the offline bundle's installation (when there is one)
#   build.log        pip install -e . for THIS machine's GPU architectures only (fast)
#   doctor.json/.txt fastpipe doctor --json, and the screen version
#   cuda-lane.log/.xml  FASTPIPE_REQUIRE_CUDA=1 pytest -m cuda tests/cuda (the whole lane: every
#                    test marked cuda lives there, tests/cuda/test_lane_collection.py holds it;
#                    so a test module elsewhere that needs a package this machine lacks cannot
#                    stop the lane's collection)
#   bench.log/.json  fastpipe bench --device cuda: every core a worker, batch 256, ResNet-50 AMP,
#                    with --budget set to the time left (KIT_BENCH_ARGS adds options)
#   gpu-decode-rows.log  with --gpu-decode: each GPU decode row of bench.json, its images/s and
#                    what its decoder did (gpu_decode_stats: images decoded on the GPU and on the
#                    CPU); failed where a row did not run or decoded none on the GPU
#   cpu-checks.log   the CUDA code's checks that need no GPU but nvcc (tests/ops/test_cuda_*.py)
#   summary.txt      the same summary
# Every step has its own time limit, and the whole kit a deadline of KIT_SECONDS (default 570,
# for a machine lent 10 minutes per command; the GPU decode session of docs/gpu.md sets 400): a
# step gets at most the time left, the bench the time left after the steps before it, the CPU
# checks (last) what remains. --quick runs the lane only (no bench, no CPU checks); --bench-only
# the bench only (no lane, no CPU checks); --no-build uses the installed fastpipe; --gpu-decode
# narrows the lane to GPU decode's tests (tests/cuda/test_gpu_decode.py) and the bench to its
# rows beside the fast CPU path (fast-cpu,gpu-decode,gpu-decode-4), and fails the kit where a GPU
# decode row did not run or decoded none of its images on the GPU (gpu-decode-rows), for a run
# that checks GPU decode alone (docs/gpu.md, "GPU decode"). Without a GPU the CUDA steps (build,
# lane, bench) report "no GPU" and the kit still runs to the end (exit 0): that is what the CPU
# test of the kit checks (tests/cuda/test_gpu_kit.py). The exit code is the first failed step's.
set -uo pipefail

out=gpu-results; quick=0; bench_only=0; build=1; gpu_decode=0
# The bench's rows with --gpu-decode: 4 workers of GPU decode against every worker of the CPU path
# (the goal against DALI needs DALI, which is not in this kit's bundle: docs/gpu.md).
GPU_DECODE_ROWS=fast-cpu,gpu-decode,gpu-decode-4
# Prints each GPU decode row of bench.json (argv[1]); exits 1 where one is missing or skipped.
CHECK_GPU_DECODE_ROWS=$(cat <<'EOF'
import json, sys
try:
    rows = {row["key"]: row for row in json.load(open(sys.argv[1]))["rows"]}
except (OSError, ValueError, KeyError, TypeError) as exc:
    sys.exit(f"no bench results to check: {exc!r}")
missing = []
for key in ("gpu-decode", "gpu-decode-4"):
    row = rows.get(key)
    if row is None or row.get("skipped"):
        missing.append(key)
        why = row["skipped"] if row else "not in the bench"
        print(f"{key}: did not run: {why}")
    else:
        rate, stats = row["images_per_second"], row.get("gpu_decode_stats")
        print(f"{key}: {rate:.1f} images/s; decoded {stats}")
print(f"fast-cpu: {rows.get('fast-cpu', {}).get('images_per_second')} images/s")
sys.exit(1 if missing else 0)
EOF
)
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    --bench-only) bench_only=1 ;;
    --no-build) build=0 ;;
    --gpu-decode) gpu_decode=1 ;;
    -*) echo "gpu-kit.sh: unknown option $arg" >&2; exit 2 ;;
    *) out=$arg ;;
  esac
done
if [[ $quick == 1 && $bench_only == 1 ]]; then
  echo "gpu-kit.sh: --quick (the lane only) and --bench-only (the bench only) exclude each other" >&2
  exit 2
fi
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
py=${PYTHON:-python3}
deadline=$((SECONDS + ${KIT_SECONDS:-570}))
work=$(mktemp -d "${TMPDIR:-/tmp}/fastpipe-kit.XXXXXX") || exit 2
logs=$work/gpu-results
mkdir -p "$logs"
summary=$logs/summary.txt
: > "$summary"
rc=0

# The two result files, rewritten whole after each step (the archive written beside, then moved).
pack() {
  cp "$summary" "$out/summary.txt"
  tar czf "$out/.gpu-results.tgz" -C "$work" gpu-results && mv "$out/.gpu-results.tgz" "$out/gpu-results.tgz"
}
trap 'pack; rm -rf "$work"' EXIT
trap 'exit 143' TERM INT

left() { echo $((deadline - SECONDS)); }
note() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT LOG COMMAND...: runs it under `timeout LIMIT` (at most the time left), its
# output into LOG (a file of the results; - for none), logs the outcome in the summary, keeps the
# first failure's code, and packs the results.
step() {
  local name=$1 limit=$2 log=$3; shift 3
  local available; available=$(left)
  (( limit > available )) && limit=$available
  if (( limit < 10 )); then
    note "$name: skipped (the kit's ${KIT_SECONDS:-570} s are used up)"
    pack
    return 0
  fi
  echo "== $name (at most $limit s)"
  local started=$SECONDS
  if [[ $log == - ]]; then
    timeout --kill-after=10 "$limit" "$@"
  else
    timeout --kill-after=10 "$limit" "$@" > "$logs/$log" 2>&1
  fi
  local r=$?
  local took=$((SECONDS - started))
  if [[ $r -eq 0 ]]; then
    note "$name: ok (${took} s)"
  elif [[ $r -eq 124 || $r -eq 137 ]]; then
    note "$name: timed out after ${took} s (limit $limit s)"
  else
    note "$name: failed, exit $r (${took} s)"
  fi
  if [[ $r -ne 0 && $rc -eq 0 ]]; then rc=$r; fi
  pack
  return 0
}
no_gpu() { note "$1: no GPU (torch sees no CUDA device): not run"; pack; }
skipped() { note "$1: skipped ($2)"; pack; }

# The offline bundle, when prepare.sh made one.
bundle=${KIT_BUNDLE:-.}
if ls "$bundle"/.gpu/whl/*.whl > /dev/null 2>&1; then
  mkdir -p /tmp/fp-site
  step bundle 120 bundle.log "$py" -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/fp-site "$bundle"/.gpu/whl/*.whl
  export PYTHONPATH=/tmp/fp-site${PYTHONPATH:+:$PYTHONPATH}
else
  skipped bundle "no offline bundle ($bundle/.gpu/whl)"
fi
# nvImageCodec and nvJPEG for GPU decode, when the bundle has them (part of the bundle step's log).
if ls "$bundle"/.gpu-nvimg/*.whl > /dev/null 2>&1; then
  mkdir -p /tmp/fp-site
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp-site \
    "$bundle"/.gpu-nvimg/*.whl >> "$logs/bundle.log" 2>&1 || echo "nvImageCodec bundle: install failed" \
    >> "$logs/bundle.log"
  [[ ":${PYTHONPATH:-}:" == *":/tmp/fp-site:"* ]] || export PYTHONPATH=/tmp/fp-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ls "$bundle"/.gpu/deb/*.deb > /dev/null 2>&1; then
  mkdir -p /tmp/fp-jpeg
  for deb in "$bundle"/.gpu/deb/*.deb; do dpkg -x "$deb" /tmp/fp-jpeg; done
  lib=$(dirname "$(find /tmp/fp-jpeg -name 'libjpeg.so*' | head -1)")
  [[ ! -e $lib/libjpeg.so ]] && ln -s "$(ls "$lib"/libjpeg.so.* | head -1)" "$lib/libjpeg.so"
  export CFLAGS="-I/tmp/fp-jpeg/usr/include -I/tmp/fp-jpeg/usr/include/x86_64-linux-gnu ${CFLAGS:-}"
  export LDFLAGS="-L$lib -Wl,-rpath,$lib ${LDFLAGS:-}"
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONUNBUFFERED=1

# This machine's GPU architectures ("9.0", or "8.0;9.0" with mixed GPUs); empty without a GPU.
archs=$(timeout 60 "$py" - 2>/dev/null <<'EOF'
import torch
if torch.cuda.is_available():
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    print(";".join(f"{major}.{minor}" for major, minor in caps))
EOF
)

{
  date -u
  timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  timeout 30 nvcc --version 2>&1 || echo "nvcc: not found"
  timeout 60 "$py" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"
  echo "GPU architectures: ${archs:-none}"
  timeout 60 "$py" -m pip list 2>/dev/null | grep -Ei 'torch|dali|nvimgcodec|nvjpeg|timm|lightning|accelerate|h5py|numpy|simplejpeg|pytest|nvidia-ml'
} > "$logs/env.txt" 2>&1
pack

if [[ -z $archs ]]; then
  no_gpu build
elif [[ $build == 0 ]]; then
  skipped build "--no-build: the installed fastpipe is used"
else
  # One architecture per GPU model present: minutes less than the default list of eight.
  step build 300 build.log env TORCH_CUDA_ARCH_LIST="$archs" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    "$py" -m pip install --no-build-isolation --no-deps --no-index -e .
fi

step doctor 60 - bash -c "'$py' -m fastpipe doctor --json > '$logs/doctor.json' 2>&1 && \
  '$py' -m fastpipe doctor > '$logs/doctor.txt' 2>&1"

if [[ $bench_only == 1 ]]; then
  skipped cuda-lane "--bench-only"
elif [[ -z $archs ]]; then
  no_gpu cuda-lane
else
  lane=tests/cuda
  [[ $gpu_decode == 1 ]] && lane=tests/cuda/test_gpu_decode.py
  step cuda-lane 240 cuda-lane.log env FASTPIPE_REQUIRE_CUDA=1 FASTPIPE_REQUIRE_EXTENSION=1 \
    "$py" -m pytest -m cuda -p no:cacheprovider -rA -v -s --junitxml="$logs/cuda-lane.xml" \
    $lane
fi

if [[ $quick == 1 ]]; then
  skipped bench "--quick"
elif [[ -z $archs ]]; then
  no_gpu bench
else
  # The bench's own budget ends its last loader's start in time: 15 s of timing, its start-up
  # and warm-up, and the report after it fit the minute and a half kept back.
  limit=330
  (( limit > $(left) - 30 )) && limit=$(( $(left) - 30 ))
  if (( limit < 120 )); then
    skipped bench "$(left) s left of the kit's ${KIT_SECONDS:-570} s; the bench needs 150"
  else
    rows=()
    [[ $gpu_decode == 1 ]] && rows=(--variants "$GPU_DECODE_ROWS")
    # shellcheck disable=SC2086 # KIT_BENCH_ARGS holds several options
    step bench "$limit" bench.log "$py" -m fastpipe bench --device cuda --no-progress \
      --save "$logs/bench.json" --budget $((limit - 90)) ${rows[@]+"${rows[@]}"} ${KIT_BENCH_ARGS:-}
  fi
fi

# GPU decode's rows, as bench.json has them: a row that was skipped, or whose every image was
# decoded on the CPU (the bench fails it then), measured no GPU decode, and the kit must not pass.
if [[ $gpu_decode == 1 ]]; then
  if [[ $quick == 1 ]]; then
    skipped gpu-decode-rows "--quick: no bench"
  elif [[ -z $archs ]]; then
    no_gpu gpu-decode-rows
  else
    step gpu-decode-rows 30 gpu-decode-rows.log "$py" -c "$CHECK_GPU_DECODE_ROWS" "$logs/bench.json"
    [[ -f $logs/gpu-decode-rows.log ]] && sed 's/^/  /' "$logs/gpu-decode-rows.log" >> "$summary"
    pack
  fi
fi

if [[ $quick == 1 || $bench_only == 1 ]]; then
  skipped cpu-checks "$([[ $quick == 1 ]] && echo --quick || echo --bench-only)"
else
  step cpu-checks "${KIT_CPU_CHECKS_SECONDS:-300}" cpu-checks.log "$py" -m pytest \
    -p no:cacheprovider -q -ra tests/ops/test_cuda_build.py tests/ops/test_cuda_fast_path.py \
    tests/ops/test_cuda_archs.py tests/ops/test_resize.py
fi

echo
cat "$summary"
[[ -f $logs/cuda-lane.log ]] && tail -n 3 "$logs/cuda-lane.log"
echo "results: $out/summary.txt and $out/gpu-results.tgz (send both back: docs/gpu.md)"
exit $rc
