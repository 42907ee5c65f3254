#!/usr/bin/env bash
# GPU device check: everything a GPU machine should run, in one go, in under 8 minutes.
#
# What it does: the gpu-marked tests on one rank (the engine on cupy against numpy in float64, and the
# count of device-to-host copies in a step), the same with two ranks sharing the GPU (tensor, pipeline
# and data parallelism on cupy against numpy; collectives on device buffers, staged and CUDA-aware),
# then `hpcpar bench --only gpu` (GEMM TFLOP/s against cupy's own matmul, one GPT step's MFU, and the same step
# in PyTorch eager if torch is there). Logs and results go to $OUT (or ./gpu-check).
#
# Prepare on a machine with network access, from the repository root:
#     make gpu-wheels        # an MPI runtime, mpi4py and pytest-mpi as wheels in .whl/ (Python 3.12)
# then run on the GPU machine, from the repository root (with .whl/ carried along):
#     bash jobs/gpu_check.sh
# What to change: PYTHON (default python3), and nothing else on a machine that already has an MPI.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-check}
mkdir -p "$out"
py=${PYTHON:-python3}
status=0

step() { echo; echo "== $*"; }
run() {   # run LOG TIMEOUT CMD...: keep the log, remember a failure, go on with the next check
    local log=$1 limit=$2
    shift 2
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$out/$log"
    local rc=${PIPESTATUS[0]}
    echo "-> exit $rc" | tee -a "$out/$log"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || status=1
}

if compgen -G ".whl/*.whl" >/dev/null; then
    step "installing the carried wheels into /tmp/site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH
    export LD_LIBRARY_PATH=/tmp/site/lib:${LD_LIBRARY_PATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export HPCPAR_SHARE_GPU=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$py" -c "import cupy, numpy, mpi4py.MPI as M; print('cupy', cupy.__version__, '| numpy', numpy.__version__,
'| MPI', M.Get_library_version().splitlines()[0], '| CUDA-aware:', getattr(M, 'Query_cuda_support', lambda: '?')())"
} 2>&1 | tee "$out/machine.txt"

step "gpu tests, 1 rank"
run gpu_tests_1rank.log 240 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py
step "gpu tests, 2 ranks sharing the GPU"
run gpu_tests_2ranks.log 240 mpiexec -n 2 "$py" -m pytest -q --only-mpi -m gpu -p no:cacheprovider tests/test_gpu_mpi.py
step "hpcpar bench --only gpu"
run gpu_bench.log 180 "$py" -m hpcpar bench --only gpu --out "$out/gpu_bench.json" --markdown "$out/gpu_bench.md"

if [ "$status" -eq 0 ]; then step "done: all passed"; else step "done: FAILURES, see $out/"; fi
exit $status
