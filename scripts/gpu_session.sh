#!/usr/bin/env bash
# The GPU plan of sarc's Triton backend: the GPU tests, the one-part distributed step on the
# GPU, then the GPU benchmark.
#
#   bash scripts/gpu_session.sh              # env + tests + dist + bench, in about 9 minutes
#   bash scripts/gpu_session.sh tests        # one step, with up to 9.5 minutes of its own
#   bash scripts/gpu_session.sh bench
#   bash scripts/gpu_session.sh train        # the two sarc train commands (not in "all": the
#                                            # GPU tests run both, held to the CPU's losses)
#   bash scripts/gpu_session.sh schedule     # benchmarks/gpu_schedule.py (not in "all")
#
# Installs nothing: it runs on the machine's python (PYTHON=...) with torch, triton and,
# where present, torch_geometric and dgl. Every step runs under a timeout, its log and exit
# code go to $OUT (default out/gpu, ignored by git), and a failed step does not stop the next.
#   $OUT/env.txt        device, driver and package versions
#   $OUT/tests.log      pytest -m gpu tests/gpu; $OUT/gpu-tests.xml (junit) when it finishes
#   $OUT/train-cuda.log sarc train models/gcn.py on Cora, --device cuda --backend triton, one
#                       process; $OUT/train-cuda.json its result
#   $OUT/train-nccl.log the same as one NCCL worker (--workers 1 --partition); train-nccl.json
#                       (tests/gpu/test_gpu_train.py holds both to the CPU run's losses)
#   $OUT/dist.log       benchmarks/distributed_step.py at 100k/2M (DIST_LAYERS, torch and
#                       triton, one NCCL process); $OUT/dist.json (rewritten after every row)
#   $OUT/bench.log      benchmarks/gpu.py; $OUT/gpu.json (rewritten after every cell)
#   $OUT/schedule-SIZE.log  benchmarks/gpu_schedule.py at each of SCHEDULE_SIZES (100k-2M...),
#                       SCHEDULE_LAYERS, SCHEDULES
#   $OUT/summary.txt    one line per step: name, exit code, seconds
# Timeouts (seconds): TESTS_TIMEOUT, TRAIN_TIMEOUT (each train step), DIST_TIMEOUT,
# BENCH_TIMEOUT; TESTS_PATHS (default tests/gpu: e.g. tests/gpu/test_gpu_precision.py alone),
# TESTS_ARGS (more pytest options; default "-n auto", one process per core, where
# pytest-xdist is installed), DIST_LAYERS, BENCH_SIZES, BENCH_REPEAT override what runs.
# "all" leaves eight files in $OUT, as many as a device call brings back (the partition of
# the train step goes to a temp folder).
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/out/gpu}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET   # compiled kernels: the interpreter is for CPU-only machines

STEPS=("$@")
if [ ${#STEPS[@]} -eq 0 ] || [ "${STEPS[0]}" = all ]; then
    STEPS=(env tests dist bench)
    # one call of at most 10 minutes: the long steps share it
    # (an H200 with 16 cores, 2026-12-04: tests 178 s in 12 processes, each train step
    # about 30 s, the benchmark 140 s)
    TESTS_TIMEOUT="${TESTS_TIMEOUT:-230}"
    TRAIN_TIMEOUT="${TRAIN_TIMEOUT:-60}"
    DIST_TIMEOUT="${DIST_TIMEOUT:-110}"
    BENCH_TIMEOUT="${BENCH_TIMEOUT:-200}"
else
    TESTS_TIMEOUT="${TESTS_TIMEOUT:-560}"
    TRAIN_TIMEOUT="${TRAIN_TIMEOUT:-270}"
    DIST_TIMEOUT="${DIST_TIMEOUT:-560}"
    BENCH_TIMEOUT="${BENCH_TIMEOUT:-560}"
fi
DIST_LAYERS="${DIST_LAYERS:-gcn,sage,gat,max}"
TESTS_PATHS="${TESTS_PATHS:-tests/gpu}"
# the tests compile hundreds of kernels: one process per core where pytest-xdist is installed
if [ -z "${TESTS_ARGS+set}" ]; then
    if "$PYTHON" -c 'import xdist' 2> /dev/null; then TESTS_ARGS="-n auto"; else TESTS_ARGS=""; fi
fi
BENCH_SIZES="${BENCH_SIZES:-100k/2M,1M/40M,233k/114M}"
BENCH_REPEAT="${BENCH_REPEAT:-3}"
SCHEDULE_SIZES="${SCHEDULE_SIZES:-100k/2M,1M/40M}"
SCHEDULE_LAYERS="${SCHEDULE_LAYERS:-GCN,GAT,GAT1x7}"
SCHEDULES="${SCHEDULES:-16,64,256:1024 64,256:1024 :1024 :4096 :none}"

: > "$OUT/summary.txt"
FAILED=0

# run_step NAME TIMEOUT LOG COMMAND...: the command under a timeout, tee'd to LOG
# (a shell function runs without one: timeout runs programs only)
run_step() {
    local name="$1" limit="$2" log="$3"
    shift 3
    local start rc
    start=$(date +%s)
    echo "== $name (timeout ${limit}s): $*" | tee "$log"
    if command -v timeout > /dev/null && ! declare -F "$1" > /dev/null; then
        timeout -k 15 "$limit" "$@" 2>&1 | tee -a "$log"
    else
        "$@" 2>&1 | tee -a "$log"
    fi
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] && echo "== $name: stopped after ${limit}s" | tee -a "$log"
    echo "$name rc=$rc seconds=$(( $(date +%s) - start ))" | tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || FAILED=1
    return 0
}

env_info() {
    date -u
    nvidia-smi || echo "nvidia-smi: not available"
    "$PYTHON" - <<'EOF'
import importlib
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
for m in ("triton", "torch_geometric", "torch_sparse", "pyg_lib", "dgl", "sympy", "jinja2", "pytest"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:  # noqa: BLE001
        print(m, "not importable:", type(e).__name__, e)
import torch.distributed as dist
print("nccl", dist.is_available() and dist.is_nccl_available())
EOF
}

for step in "${STEPS[@]}"; do
    case "$step" in
        env)
            run_step env 120 "$OUT/env.txt" env_info ;;
        tests)
            run_step tests "$TESTS_TIMEOUT" "$OUT/tests.log" \
                "$PYTHON" -m pytest -m gpu $TESTS_ARGS $TESTS_PATHS -v -rfEs --durations=25 \
                -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" ;;
        train)
            if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2> /dev/null; then
                # as the tests and the benchmark do: no GPU is a skip, not a failed step
                echo "== train: skipped (no CUDA GPU: torch.cuda.is_available() is False)" |
                    tee "$OUT/train-cuda.log" "$OUT/train-nccl.log"
                echo "train rc=0 seconds=0 skipped: no CUDA GPU" | tee -a "$OUT/summary.txt"
                continue
            fi
            run_step train-cuda "$TRAIN_TIMEOUT" "$OUT/train-cuda.log" \
                "$PYTHON" -m sarc.cli train models/gcn.py --dataset cora --device cuda \
                --backend triton --epochs 3 --json "$OUT/train-cuda.json"
            parts="$(mktemp -d)/parts-cora-1"
            run_step train-nccl "$TRAIN_TIMEOUT" "$OUT/train-nccl.log" bash -c \
                '"$1" -m sarc.cli partition --dataset cora --parts 1 --method random \
                     --out "$3" --overwrite &&
                 "$1" -m sarc.cli train models/gcn.py --dataset cora --device cuda \
                     --backend triton --epochs 3 --workers 1 --partition "$3" \
                     --json "$2/train-nccl.json"' bash "$PYTHON" "$OUT" "$parts" ;;
        dist)
            # without a GPU it measures the torch rows on the CPU, and says so
            run_step dist "$DIST_TIMEOUT" "$OUT/dist.log" \
                "$PYTHON" benchmarks/distributed_step.py --nodes 100000 --edges 2000000 \
                --layers "$DIST_LAYERS" --backends torch,triton --repeats 5 \
                --json "$OUT/dist.json" ;;
        bench)
            # the benchmark stops starting cells 60 s before its timeout, and prints its tables
            run_step bench "$BENCH_TIMEOUT" "$OUT/bench.log" \
                "$PYTHON" benchmarks/gpu.py --sizes "$BENCH_SIZES" --repeat "$BENCH_REPEAT" \
                --budget-s $(( BENCH_TIMEOUT > 120 ? BENCH_TIMEOUT - 60 : BENCH_TIMEOUT / 2 )) \
                --json "$OUT/gpu.json" ;;
        schedule)
            # not in "all": the row schedules of the Triton kernels, per size
            for size in ${SCHEDULE_SIZES//,/ }; do
                run_step "schedule-$size" "$BENCH_TIMEOUT" "$OUT/schedule-${size//\//-}.log" \
                    "$PYTHON" benchmarks/gpu_schedule.py --size "$size" \
                    --layers "$SCHEDULE_LAYERS" --schedules "$SCHEDULES"
            done ;;
        *)
            echo "unknown step '$step' (steps: env, tests, train, dist, bench, schedule, all)" | tee -a "$OUT/summary.txt"
            FAILED=1 ;;
    esac
done

echo "== summary ($OUT/summary.txt)"
cat "$OUT/summary.txt"
exit "$FAILED"
