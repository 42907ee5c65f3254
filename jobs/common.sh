# shellcheck shell=bash
# jobs/common.sh - helpers shared by the job scripts in jobs/: checks, environment, banner, launch.
#
# Not a job script: the *.sbatch files `source` it.  Every function here is small and named for
# what it does, so a job script reads as a list of steps.  The variables below are read by these
# helpers and so work the same way in every job script (all optional):
#
#   HPCPAR_HOME      the repository; default: the directory sbatch was run in ($SLURM_SUBMIT_DIR)
#   HPCPAR_VENV      the Python environment holding hpcpar and its MPI; default: $HPCPAR_HOME/.venv
#   HPCPAR_CMD       the program every rank runs; default: hpcpar train
#   HPCPAR_ARGS      its flags after --tp/--pp/--dp; default: the training flags (train_args below).
#                    Set it empty to pass none: HPCPAR_CMD="hpcpar grid" HPCPAR_ARGS= sbatch ...
#   HPCPAR_LAUNCHER  srun (default) or mpiexec (the MPI library's own launcher, inside the allocation)
#   SRUN_MPI         srun's --mpi plugin; default pmi2 (the MPICH wheel).  Open MPI: pmix
#   SRUN_FLAGS       extra srun flags, e.g. "--cpu-bind=cores" or "--gpu-bind=closest"
#   MPIEXEC_FLAGS    extra mpiexec flags, e.g. "--bind-to none" for Open MPI
#   RUN_DIR          where metrics go; default: $HPCPAR_HOME/runs/<job name>-<job id>
#   HPCPAR_DRY_RUN=1 print the launch command instead of running it (check a script before queueing)
#
# Training flags (passed only when HPCPAR_ARGS is unset): SCHEDULE (1f1b), MICROBATCHES (hpcpar's
# default: PP), MODEL (tiny), DATA (synthetic), STEPS (100), BATCH_SIZE (16, the global batch),
# BACKEND (cupy when the job holds GPUs, else numpy), DTYPE (hpcpar's default, float32),
# METRICS ($RUN_DIR/metrics.jsonl; set but empty: none).
#
# Exit statuses, the same as hpcpar's: 0 done, 1 failure, 2 bad configuration, 3 preempted after
# writing a checkpoint (requeue me).

EXIT_USAGE=2

# --- checks -------------------------------------------------------------------------------------

# fail MESSAGE: a configuration the user must change.  Exit 2, like hpcpar itself, so that a wrong
# setting and a crash can be told apart in the job's exit code.
fail() {
    echo "$JOB_SCRIPT: error: $*" >&2
    exit "$EXIT_USAGE"
}

# require VAR HINT: VAR must be set and not empty; HINT says what to set it to.
require() {
    [[ -n ${!1:-} ]] || fail "set $1 to $2"
}

# require_count VAR HINT: VAR must be a whole number of at least 1 (a size, a count of ranks).
require_count() {
    require "$1" "$2"
    [[ ${!1} =~ ^[1-9][0-9]*$ ]] || fail "$1 must be a whole number >= 1, not '${!1}'"
}

# inside_allocation: the scripts read the job's size from Slurm's variables.
inside_allocation() {
    require SLURM_NTASKS "the job's number of tasks: submit this script with sbatch (e.g. $USAGE)"
}

# fixed_layout: TP, PP and DP all given; RANKS, their product, must fit in the job.
fixed_layout() {
    require_count TP "the tensor-parallel size, e.g. $USAGE"
    require_count PP "the pipeline-parallel size, e.g. $USAGE"
    require_count DP "the data-parallel size, e.g. $USAGE"
    inside_allocation
    RANKS=$(( TP * PP * DP ))
    check_ranks "$RANKS"
}

# check_ranks RANKS: a layout may use fewer ranks than the job has tasks, never more.
check_ranks() {
    local ranks=$1
    (( ranks <= SLURM_NTASKS )) \
        || fail "the layout needs $ranks ranks but the job has $SLURM_NTASKS task(s): submit with --ntasks=$ranks"
    if (( ranks < SLURM_NTASKS )); then
        echo "note: the layout uses $ranks of the job's $SLURM_NTASKS tasks"
    fi
}

# --- environment --------------------------------------------------------------------------------

setup_environment() {
    HPCPAR_VENV=${HPCPAR_VENV:-$HPCPAR_HOME/.venv}
    [[ -x $HPCPAR_VENV/bin/python ]] \
        || fail "no Python environment at HPCPAR_VENV=$HPCPAR_VENV: run 'make install' in $HPCPAR_HOME, or set HPCPAR_VENV"
    # hpcpar, python and the MPI wheel's mpiexec come first on PATH; srun passes PATH to the ranks.
    export PATH=$HPCPAR_VENV/bin:$PATH

    # One OpenMP/BLAS thread per CPU the rank owns: more threads than CPUs only fight each other.
    local cpus=${SLURM_CPUS_PER_TASK:-1}
    export OMP_NUM_THREADS=$cpus OPENBLAS_NUM_THREADS=$cpus MKL_NUM_THREADS=$cpus
    # Since Slurm 22.05 srun no longer inherits sbatch's --cpus-per-task; this hands it on.
    if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
        export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
    fi

    # A job that holds GPUs computes on them.  Each rank picks GPU number SLURM_LOCALID itself
    # (hpcpar.comm.device.select_device), so nothing here sets CUDA_VISIBLE_DEVICES.
    if [[ -z ${BACKEND:-} ]]; then
        if [[ ${SLURM_GPUS_ON_NODE:-0} != 0 ]]; then BACKEND=cupy; else BACKEND=numpy; fi
    fi

    RUN_DIR=${RUN_DIR:-$HPCPAR_HOME/runs/${SLURM_JOB_NAME:-job}-${SLURM_JOB_ID:-$$}}
    mkdir -p "$RUN_DIR"
}

# --- what the ranks run -------------------------------------------------------------------------

# train_args: the flags of `hpcpar train` other than the layout, into the array TRAIN_ARGS.
# METRICS set but empty: no metrics file.
# --no-progress: a progress bar redrawn in a log file is noise; the loss lines stay.
train_args() {
    local metrics=${METRICS-$RUN_DIR/metrics.jsonl}
    TRAIN_ARGS=(--schedule "${SCHEDULE:-1f1b}" --model "${MODEL:-tiny}" --data "${DATA:-synthetic}"
                --steps "${STEPS:-100}" --batch-size "${BATCH_SIZE:-16}" --backend "$BACKEND")
    if [[ -n $metrics ]]; then
        TRAIN_ARGS+=(--metrics "$metrics")
    fi
    TRAIN_ARGS+=(--no-progress)
    if [[ -n ${MICROBATCHES:-} ]]; then
        TRAIN_ARGS+=(--microbatches "$MICROBATCHES")
    fi
    if [[ -n ${DTYPE:-} ]]; then
        TRAIN_ARGS+=(--dtype "$DTYPE")
    fi
}

# payload_args [DEFAULT FLAGS...]: HPCPAR_ARGS split into words when it is set (empty: no flags),
# else the default flags, into the array ARGS.
payload_args() {
    if [[ -v HPCPAR_ARGS ]]; then
        # `read -a` splits on spaces without expanding * or ?: the variables hold words, not shell code.
        read -r -a ARGS <<<"$HPCPAR_ARGS"
    else
        ARGS=("$@")
    fi
}

# build_payload TP PP DP [DEFAULT FLAGS...]: the command every rank runs, into the array PAYLOAD:
# HPCPAR_CMD, the layout flags, then HPCPAR_ARGS - or, when HPCPAR_ARGS is unset, the default flags.
build_payload() {
    local tp=$1 pp=$2 dp=$3 cmd=()
    shift 3
    read -r -a cmd <<<"${HPCPAR_CMD:-hpcpar train}"
    payload_args "$@"
    PAYLOAD=("${cmd[@]}" --tp "$tp" --pp "$pp" --dp "$dp" "${ARGS[@]}")
}

# launch_command RANKS: the full command line, launcher included, into the array LAUNCH.
launch_command() {
    local ranks=$1 extra=()
    case ${HPCPAR_LAUNCHER:-srun} in
        srun)
            # --mpi=pmi2 is how the MPICH wheel's ranks find each other; with --mpi=none they would
            # start as RANKS separate one-rank jobs.  --wait=120: once one rank has ended, the rest
            # get 120 s to follow, so a rank that dies without MPI_Abort (a segfault, the OOM
            # killer) cannot leave the others waiting in a collective until the time limit.
            # (Not --kill-on-bad-exit: on a bad configuration every rank exits 2 by itself, and
            # killing the slower ones could turn the job's status 2 into 143.)
            read -r -a extra <<<"${SRUN_FLAGS:-}"
            LAUNCH=(srun --mpi="${SRUN_MPI:-pmi2}" --ntasks="$ranks" --wait=120
                    "${extra[@]}" "${PAYLOAD[@]}")
            ;;
        mpiexec)
            # mpiexec reads the allocation from Slurm and starts one proxy per node with srun; every
            # rank then inherits its proxy's SLURM_LOCALID (0), which would put all the ranks of a
            # node on GPU 0.  Without it hpcpar takes the node-local rank from MPI instead.
            read -r -a extra <<<"${MPIEXEC_FLAGS:-}"
            LAUNCH=(mpiexec -n "$ranks" "${extra[@]}" env -u SLURM_LOCALID "${PAYLOAD[@]}")
            ;;
        *)
            fail "HPCPAR_LAUNCHER must be srun or mpiexec, not '$HPCPAR_LAUNCHER'"
            ;;
    esac
    echo "== launch: ${LAUNCH[*]}"
}

# dry_run: true, after saying so, when HPCPAR_DRY_RUN=1 asks for the launch line only.
dry_run() {
    [[ ${HPCPAR_DRY_RUN:-0} == 1 ]] || return 1
    echo "== dry run (HPCPAR_DRY_RUN=1): nothing launched"
}

# run_payload RANKS: launch, wait, report; returns the payload's exit status.
run_payload() {
    launch_command "$1"
    run_launch
}

# run_launch: run the command in LAUNCH (unless this is a dry run) and end the log with its exit
# status, which it returns.
run_launch() {
    local status=0
    if dry_run; then
        return 0
    fi
    "${LAUNCH[@]}" || status=$?
    job_end "$status"
    return "$status"
}

# --- what the job log says ----------------------------------------------------------------------

commit() {
    local head
    head=$(git -C "$HPCPAR_HOME" rev-parse HEAD 2>/dev/null) || { echo "unknown (git rev-parse HEAD failed)"; return; }
    if git -C "$HPCPAR_HOME" diff --quiet HEAD 2>/dev/null; then
        echo "$head"
    else
        echo "$head (with uncommitted changes)"
    fi
}

# job_start: enough in the log to tell later where, when and with which code this ran.
job_start() {
    echo "== $JOB_SCRIPT: job ${SLURM_JOB_ID:-none} (${SLURM_JOB_NAME:-no name}) started $(date '+%F %T %Z')"
    echo "== nodes: ${SLURM_JOB_NODELIST:-$(hostname -s)} (${SLURM_JOB_NUM_NODES:-1} node(s)), $SLURM_NTASKS task(s)," \
         "${SLURM_CPUS_PER_TASK:-1} CPU(s) and $OMP_NUM_THREADS thread(s) per task, ${SLURM_GPUS_ON_NODE:-0} GPU(s) per node"
    echo "== code: $HPCPAR_HOME at commit $(commit); python: $HPCPAR_VENV/bin/python"
    if [[ -n ${SLURM_RESTART_COUNT:-} ]]; then
        echo "== restart $SLURM_RESTART_COUNT of this job (it was requeued)"
    fi
}

describe_status() {
    case $1 in
        0) echo "done" ;;
        1) echo "failure" ;;
        2) echo "bad configuration" ;;
        3) echo "preempted, checkpoint written" ;;
        *) if (( $1 > 128 )); then echo "killed by signal $(( $1 - 128 ))"; else echo "failure"; fi ;;
    esac
}

job_end() {
    echo "== $JOB_SCRIPT: ended $(date '+%F %T %Z') after ${SECONDS} s, exit status $1 ($(describe_status "$1"))"
}
