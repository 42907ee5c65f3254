#!/usr/bin/env bash
# GPU device check: everything a GPU machine should run, in one go, in under 8 minutes.
#
# What it does, each step with a time limit (the limits add up to 7.5 minutes):
#   1. install the carried wheels (.whl/: cupy-cuda12x, fastrlock, ml_dtypes, an MPI runtime, mpi4py,
#      pytest-mpi) into /tmp/site; if cupy is still missing, pip installs cupy-cuda12x from the registry
#   2. the gpu tests on one rank (the engine on cupy against numpy in float64, fp16 on the device, TF32,
#      the one device-to-host copy per step, checkpoint resume from device arrays) and on two ranks
#      sharing the GPU (tensor, pipeline and data parallelism; collectives staged and CUDA-aware).
#      HPCPAR_REAL_GPU=1: a missing GPU fails them instead of falling back to the CuPy stand-in
#   3. `hpcpar bench --only gpu`: GEMM rates against cupy's own matmul, one block against PyTorch
#   4. `hpcpar bench --only gpu-step`: one GPT-2 124M step in fp32 / tf32 / fp16 / bf16 against
#      PyTorch eager, MFU against the GPU's peak, and the staging cost against the tp = 1 step
# Logs, gpu_step.json and gpu_step.md (the table for BENCHMARKS.md) go to $OUT (or ./gpu-check).
#
# HPCPAR_GPU_CHECK_DRY_RUN=1 runs every step on a machine without a GPU, so that this script cannot
# rot: it lists the wheels instead of installing them, the tests run on the CuPy stand-in
# (tests/fake_cupy) and the benchmark on numpy with a tiny model.  tests/test_jobs.py does this.
#
# Prepare on a machine with network access, from the repository root:
#     make gpu-wheels        # the wheels above in .whl/ (Python 3.12, x86-64)
# then run on the GPU machine, from the repository root (with .whl/ carried along):
#     bash jobs/gpu_check.sh
# What to change: PYTHON (default python3), and nothing else on a machine that already has an MPI.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-check}
mkdir -p "$out"
py=${PYTHON:-python3}
dry=${HPCPAR_GPU_CHECK_DRY_RUN:-0}
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

step "installing the carried wheels into /tmp/site"
if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "no .whl/: using what $py already has"
elif [ "$dry" = 1 ]; then
    echo "dry run: would install"; ls .whl/*.whl
else
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH
    export LD_LIBRARY_PATH=/tmp/site/lib:${LD_LIBRARY_PATH:-}
fi
if [ "$dry" != 1 ] && ! PYTHONPATH=/tmp/site:${PYTHONPATH:-} "$py" -c "import cupy" 2>/dev/null; then
    echo "no cupy among them: trying the package registry"
    "$py" -m pip install -q --no-cache-dir --target /tmp/site cupy-cuda12x ml_dtypes || echo "cupy install failed"
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export HPCPAR_SHARE_GPU=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
pick=()                          # the tests to run: all of them, or one per file in a dry run
if [ "$dry" = 1 ]; then
    export HPCPAR_GPU_CHECK_DRY_RUN=1
    pick=(-k "copies_to_the_host_once or collectives_on_device_buffers")
else
    export HPCPAR_REAL_GPU=1
fi
read -r -a mpiexec <<< "${HPCPAR_MPIEXEC:-mpiexec}"

step "machine"
{ if [ "$dry" = 1 ]; then echo "dry run: no GPU, the CuPy stand-in"; else
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; fi
  "$py" -c "import numpy, mpi4py.MPI as M
try:
    import cupy; c = cupy.__version__
except ImportError:
    c = 'not installed'
print('cupy', c, '| numpy', numpy.__version__, '| MPI', M.Get_library_version().splitlines()[0],
      '| CUDA-aware:', getattr(M, 'Query_cuda_support', lambda: '?')())"
} 2>&1 | tee "$out/machine.txt"

step "gpu tests, 1 rank"
run gpu_tests_1rank.log 100 "$py" -m pytest -q -m gpu -p no:cacheprovider "${pick[@]}" tests/test_gpu.py
step "gpu tests, 2 ranks sharing the GPU"
run gpu_tests_2ranks.log 100 "${mpiexec[@]}" -n 2 "$py" -m pytest -q --only-mpi -m gpu -p no:cacheprovider "${pick[@]}" \
    tests/test_gpu_mpi.py
step "hpcpar bench --only gpu"
run gpu_bench.log 80 "$py" -m hpcpar bench --only gpu --out "$out/gpu_bench.json" --markdown "$out/gpu_bench.md"
step "hpcpar bench --only gpu-step"
run gpu_step.log 170 "$py" -m hpcpar bench --only gpu-step --out "$out/gpu_step.json" --markdown "$out/gpu_step.md"

if [ "$status" -eq 0 ]; then step "done: all passed"; else step "done: FAILURES, see $out/"; fi
exit $status
