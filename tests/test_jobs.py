"""The job scripts in jobs/ without Slurm: syntax, shellcheck, refusals, and the commands they build.

Here each script runs as plain bash with the variables Slurm would give it, and either
HPCPAR_DRY_RUN=1 (it prints the launch line instead of running it) or stand-ins for srun and
scontrol on PATH.  `make test-slurm` (tests/slurm/run.sh) runs the same scripts on a real Slurm.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOB_SCRIPTS = sorted(p.name for p in (ROOT / "jobs").glob("*.sbatch"))
SHELL_FILES = sorted(str(p.relative_to(ROOT)) for p in
                     [*(ROOT / "jobs").glob("*.sbatch"), *(ROOT / "jobs").glob("*.sh"),
                      *(ROOT / "tests" / "slurm").glob("*.sh")])
VENV = Path(sys.executable).parent.parent     # the environment running these tests


def run_job(script, tmp_path, dry_run=True, path_prefix=None, **variables):
    """bash jobs/<script> in a clean environment holding only ``variables`` and the basics."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"),
           "HPCPAR_HOME": str(ROOT), "HPCPAR_VENV": str(VENV), "RUN_DIR": str(tmp_path / "run")}
    if dry_run:
        env["HPCPAR_DRY_RUN"] = "1"
    if path_prefix:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    env.update({name: str(value) for name, value in variables.items()})
    return subprocess.run(["bash", str(ROOT / "jobs" / script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def launch_line(proc):
    """The command the script launched (or would have), from its '== launch:' line."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("== launch: ")]
    assert len(lines) == 1, proc.stdout
    return lines[0].removeprefix("== launch: ")


def refusal(proc):
    """A refused configuration: exit 2 and exactly one line on stderr; returns that line."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# --- syntax and lint ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", SHELL_FILES)
def test_bash_syntax(path):
    proc = subprocess.run(["bash", "-n", path], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="session")
def shellcheck():
    """shellcheck, installed from Debian's packages when missing and possible (root, apt-get)."""
    if shutil.which("shellcheck") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "shellcheck"]
        try:
            if subprocess.run(install, env=env, capture_output=True, timeout=240).returncode != 0:
                subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=240)
                subprocess.run(install, env=env, capture_output=True, timeout=240)
        except subprocess.TimeoutExpired:
            pass
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed and could not be installed (apt-get install shellcheck)")
    return exe


@pytest.mark.parametrize("path", SHELL_FILES)
def test_shellcheck(shellcheck, path):
    # -x follows `source`; the scripts name jobs/common.sh relative to the repository root
    proc = subprocess.run([shellcheck, "-x", path], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", JOB_SCRIPTS)
def test_every_job_script_says_what_it_is_for_and_what_to_change(script):
    text = (ROOT / "jobs" / script).read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines[1].startswith(f"# jobs/{script} - ")
    assert "# For:" in text and "# Change:" in text
    assert "\nset -euo pipefail\n" in text


# --- required variables --------------------------------------------------------------------------

@pytest.mark.parametrize("script, variables, message", [
    ("single_node.sbatch", {"PP": 2, "DP": 2},
     "set TP to the tensor-parallel size, e.g. TP=2 PP=2 DP=2 sbatch jobs/single_node.sbatch"),
    ("single_node.sbatch", {"TP": 2, "DP": 2}, "set PP to the pipeline-parallel size, e.g. TP=2 PP=2 DP=2"),
    ("single_node.sbatch", {"TP": 2, "PP": 2}, "set DP to the data-parallel size, e.g. TP=2 PP=2 DP=2"),
    ("multi_node.sbatch", {"PP": 2},
     "set TP to the tensor-parallel size (at most the ranks per node), e.g. TP=4 PP=2 sbatch jobs/multi_node.sbatch"),
    ("multi_node.sbatch", {"TP": 4}, "set PP to the pipeline-parallel size, e.g. TP=4 PP=2"),
    ("preemptible.sbatch", {"PP": 1, "DP": 1}, "set TP to the tensor-parallel size, e.g. TP=2 PP=2 DP=2"),
    ("scaling.sbatch", {"SLURM_NTASKS": 8},
     "set RANKS to the rank counts: submit as an array, e.g. sbatch --array=1,2,4,8 jobs/scaling.sbatch, "
     "or set RANKS=1,2,4,8"),
    ("single_node.sbatch", {"TP": 2, "PP": 2, "DP": 2},
     "set SLURM_NTASKS to the job's number of tasks: submit this script with sbatch"),
])
def test_a_missing_variable_is_named_with_an_example(tmp_path, script, variables, message):
    line = refusal(run_job(script, tmp_path, **variables))
    assert line.startswith(f"{script}: error: {message}")


def test_a_size_must_be_a_whole_number(tmp_path):
    line = refusal(run_job("single_node.sbatch", tmp_path, TP="two", PP=1, DP=1, SLURM_NTASKS=8))
    assert line == "single_node.sbatch: error: TP must be a whole number >= 1, not 'two'"


def test_a_layout_larger_than_the_job_is_refused(tmp_path):
    line = refusal(run_job("single_node.sbatch", tmp_path, TP=2, PP=2, DP=2, SLURM_NTASKS=4))
    assert line.endswith("the layout needs 8 ranks but the job has 4 task(s): submit with --ntasks=8")


def test_a_missing_environment_is_refused(tmp_path):
    line = refusal(run_job("single_node.sbatch", tmp_path, TP=1, PP=1, DP=1, SLURM_NTASKS=1,
                           HPCPAR_VENV=tmp_path / "nowhere"))
    assert f"no Python environment at HPCPAR_VENV={tmp_path / 'nowhere'}" in line


def test_the_helpers_are_found_from_the_submit_directory(tmp_path):
    proc = run_job("single_node.sbatch", tmp_path, TP=1, PP=1, DP=1, SLURM_NTASKS=1, HPCPAR_HOME=tmp_path)
    assert proc.returncode == 2
    assert "submit from the repository root or set HPCPAR_HOME" in proc.stderr


# --- the command each script builds --------------------------------------------------------------

def test_single_node_runs_the_training_command(tmp_path):
    line = launch_line(run_job("single_node.sbatch", tmp_path, TP=2, PP=2, DP=2, SLURM_NTASKS=8))
    assert line == ("srun --mpi=pmi2 --ntasks=8 --wait=120 hpcpar train --tp 2 --pp 2 --dp 2 "
                    "--schedule 1f1b --model tiny --data synthetic --steps 100 --batch-size 16 "
                    f"--backend numpy --metrics {tmp_path}/run/metrics.jsonl --no-progress")


def test_training_settings_come_from_variables(tmp_path):
    line = launch_line(run_job("single_node.sbatch", tmp_path, TP=1, PP=2, DP=1, SLURM_NTASKS=2,
                               SCHEDULE="gpipe", MICROBATCHES=4, MODEL="small", STEPS=7, BATCH_SIZE=8,
                               SAVE_DIR="/ckpt", SAVE_EVERY=5))
    assert ("--schedule gpipe --model small --data synthetic --steps 7 --batch-size 8" in line
            and line.endswith("--no-progress --microbatches 4 --save /ckpt --save-every 5"))


def test_the_payload_and_its_flags_can_be_replaced(tmp_path):
    layout = dict(TP=2, PP=2, DP=2, SLURM_NTASKS=8, HPCPAR_CMD="hpcpar grid")
    assert launch_line(run_job("single_node.sbatch", tmp_path, HPCPAR_ARGS="", **layout)).endswith(
        " hpcpar grid --tp 2 --pp 2 --dp 2")
    assert launch_line(run_job("single_node.sbatch", tmp_path, HPCPAR_ARGS="--debug --seed 3", **layout)).endswith(
        " hpcpar grid --tp 2 --pp 2 --dp 2 --debug --seed 3")


def test_a_smaller_layout_uses_part_of_the_job(tmp_path):
    proc = run_job("single_node.sbatch", tmp_path, TP=2, PP=1, DP=1, SLURM_NTASKS=8)
    assert launch_line(proc).startswith("srun --mpi=pmi2 --ntasks=2 ")
    assert "note: the layout uses 2 of the job's 8 tasks" in proc.stdout


def test_mpiexec_launch_hides_the_proxys_slurm_localid(tmp_path):
    line = launch_line(run_job("single_node.sbatch", tmp_path, TP=2, PP=2, DP=2, SLURM_NTASKS=8,
                               HPCPAR_LAUNCHER="mpiexec", MPIEXEC_FLAGS="--bind-to none"))
    assert line.startswith("mpiexec -n 8 --bind-to none env -u SLURM_LOCALID hpcpar train --tp 2 ")


def test_srun_flags_and_mpi_plugin_can_be_changed(tmp_path):
    line = launch_line(run_job("single_node.sbatch", tmp_path, TP=1, PP=1, DP=2, SLURM_NTASKS=2,
                               SRUN_MPI="pmix", SRUN_FLAGS="--cpu-bind=cores"))
    assert line.startswith("srun --mpi=pmix --ntasks=2 --wait=120 --cpu-bind=cores hpcpar train ")


def test_an_unknown_launcher_is_refused(tmp_path):
    line = refusal(run_job("single_node.sbatch", tmp_path, TP=1, PP=1, DP=1, SLURM_NTASKS=1,
                           HPCPAR_LAUNCHER="mpirun"))
    assert line.endswith("HPCPAR_LAUNCHER must be srun or mpiexec, not 'mpirun'")


def test_gpus_in_the_job_select_the_cupy_backend(tmp_path):
    gpus = dict(TP=2, PP=1, DP=2, SLURM_NTASKS=4, SLURM_GPUS_ON_NODE=4)
    assert "--backend cupy" in launch_line(run_job("multi_node.sbatch", tmp_path, **gpus))
    assert "--backend numpy" in launch_line(run_job("multi_node.sbatch", tmp_path, BACKEND="numpy", **gpus))


def test_multi_node_fills_the_allocation_with_data_parallel_replicas(tmp_path):
    line = launch_line(run_job("multi_node.sbatch", tmp_path, TP=2, PP=2, SLURM_NTASKS=16,
                               SLURM_TASKS_PER_NODE="4(x4)"))
    assert line.startswith("srun --mpi=pmi2 --ntasks=16 --wait=120 hpcpar train --tp 2 --pp 2 --dp 4 ")


def test_multi_node_refuses_tasks_that_do_not_split(tmp_path):
    line = refusal(run_job("multi_node.sbatch", tmp_path, TP=4, PP=1, SLURM_NTASKS=6))
    assert line.endswith("6 tasks do not split into TP x PP = 4 x 1 blocks: set DP, or change the task count")


def test_multi_node_warns_when_tensor_parallel_groups_span_nodes(tmp_path):
    proc = run_job("multi_node.sbatch", tmp_path, TP=8, PP=1, SLURM_NTASKS=16, SLURM_TASKS_PER_NODE="4(x4)")
    assert proc.returncode == 0, proc.stderr
    assert "warning: TP=8 does not divide the 4 ranks per node" in proc.stdout


TRAINING = "--schedule 1f1b --model tiny --data synthetic --steps 100 --batch-size 16 --backend numpy --no-progress"


@pytest.mark.parametrize("variables, sweep, launcher", [
    ({}, "--ranks 4 --mode strong --layouts dp --launcher srun --timeout 600", "srun --mpi=pmi2 --wait=120"),
    ({"SCALING_MODE": "weak", "LAYOUTS": "tp2dp,pp", "POINT_TIMEOUT": 60, "SRUN_FLAGS": "--cpu-bind=cores"},
     "--ranks 4 --mode weak --layouts tp2dp,pp --launcher srun --timeout 60",
     "srun --mpi=pmi2 --wait=120 --cpu-bind=cores"),
    ({"HPCPAR_LAUNCHER": "mpiexec", "MPIEXEC_FLAGS": "-bind-to core"},
     "--ranks 4 --mode strong --layouts dp --launcher mpiexec --timeout 600", "mpiexec -bind-to core"),
])
def test_an_array_task_runs_its_point_with_hpcpar_scaling(tmp_path, variables, sweep, launcher):
    proc = run_job("scaling.sbatch", tmp_path, SLURM_ARRAY_TASK_ID=4, SLURM_NTASKS=8, **variables)
    assert launch_line(proc) == f"hpcpar scaling {sweep} --out {tmp_path}/run {TRAINING}"
    assert f"== each point: {launcher} -n <ranks> hpcpar train ..." in proc.stdout


def test_scaling_without_an_array_runs_every_point_of_ranks(tmp_path):
    proc = run_job("scaling.sbatch", tmp_path, RANKS="1,2,4", SLURM_NTASKS=4, HPCPAR_ARGS="--steps 5")
    assert launch_line(proc) == (f"hpcpar scaling --ranks 1,2,4 --mode strong --layouts dp --launcher srun "
                                 f"--timeout 600 --out {tmp_path}/run --steps 5")


@pytest.mark.parametrize("variables, message", [
    ({"RANKS": "1,2,16"}, "the layout needs 16 ranks but the job has 8 task(s)"),
    ({"RANKS": "1,two"}, "RANKS must list whole numbers >= 1, e.g. 1,2,4,8, not '1,two'"),
    ({"RANKS": ","}, "RANKS must list whole numbers >= 1"),
    ({"SLURM_ARRAY_TASK_ID": 16}, "the layout needs 16 ranks but the job has 8 task(s)"),
])
def test_scaling_refuses_points_it_cannot_run(tmp_path, variables, message):
    assert message in refusal(run_job("scaling.sbatch", tmp_path, SLURM_NTASKS=8, **variables))


def test_preemptible_saves_and_resumes_in_one_directory(tmp_path):
    line = launch_line(run_job("preemptible.sbatch", tmp_path, TP=2, PP=2, DP=2, SLURM_NTASKS=8,
                               CKPT_DIR=tmp_path / "ckpt", SAVE_EVERY=20))
    assert line.endswith(f"--save {tmp_path}/ckpt --save-every 20 --resume {tmp_path}/ckpt")


@pytest.mark.parametrize("script", JOB_SCRIPTS)
def test_scripts_that_resume_run_one_at_a_time(script):
    """A script that resumes a checkpoint directory waits for any job of its name (singleton): two runs
    of one directory would delete each other's steps (hpcpar's lock refuses the second, too)."""
    text = (ROOT / "jobs" / script).read_text()
    assert ("--resume" in text) == ("#SBATCH --dependency=singleton" in text), script


# --- running the payload, with stand-ins for srun and scontrol ------------------------------------

@pytest.fixture
def fake_slurm(tmp_path):
    """A bin directory with an `srun` that reports what the ranks would get and exits FAKE_EXIT,
    and an `scontrol` that reports how it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(textwrap.dedent("""\
        #!/bin/sh
        env | grep -E '^(OMP_NUM_THREADS|OPENBLAS_NUM_THREADS|MKL_NUM_THREADS|SRUN_CPUS_PER_TASK)=' | sort
        exit "${FAKE_EXIT:-0}"
    """))
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "scontrol $*"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def test_threads_and_srun_cpus_follow_cpus_per_task(tmp_path, fake_slurm):
    proc = run_job("multi_node.sbatch", tmp_path, dry_run=False, path_prefix=fake_slurm,
                   TP=1, PP=1, SLURM_NTASKS=2, SLURM_CPUS_PER_TASK=4, OMP_NUM_THREADS=64)
    assert proc.returncode == 0, proc.stderr
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "SRUN_CPUS_PER_TASK"):
        assert f"{var}=4\n" in proc.stdout
    assert "4 CPU(s) and 4 thread(s) per task" in proc.stdout


@pytest.mark.parametrize("status, meaning", [(0, "done"), (1, "failure"), (2, "bad configuration"),
                                             (137, "killed by signal 9")])
def test_the_jobs_exit_status_is_the_payloads(tmp_path, fake_slurm, status, meaning):
    proc = run_job("single_node.sbatch", tmp_path, dry_run=False, path_prefix=fake_slurm,
                   TP=1, PP=1, DP=1, SLURM_NTASKS=1, FAKE_EXIT=status)
    assert proc.returncode == status
    assert f"exit status {status} ({meaning})" in proc.stdout


def test_preemptible_requeues_itself_after_exit_3(tmp_path, fake_slurm):
    proc = run_job("preemptible.sbatch", tmp_path, dry_run=False, path_prefix=fake_slurm,
                   TP=1, PP=1, DP=1, SLURM_NTASKS=1, SLURM_JOB_ID=42, FAKE_EXIT=3, CKPT_DIR=tmp_path / "ckpt")
    assert proc.returncode == 3
    assert "exit status 3 (preempted, checkpoint written)" in proc.stdout
    assert "scontrol requeue 42\n" in proc.stdout


def test_preemptible_stops_requeueing_after_max_requeues(tmp_path, fake_slurm):
    proc = run_job("preemptible.sbatch", tmp_path, dry_run=False, path_prefix=fake_slurm,
                   TP=1, PP=1, DP=1, SLURM_NTASKS=1, SLURM_JOB_ID=42, FAKE_EXIT=3,
                   SLURM_RESTART_COUNT=2, MAX_REQUEUES=2, CKPT_DIR=tmp_path / "ckpt")
    assert proc.returncode == 3
    assert "requeued 2 times, MAX_REQUEUES=2: not requeueing again" in proc.stdout
    assert "scontrol" not in proc.stdout


def test_preemptible_does_not_requeue_a_finished_or_failed_run(tmp_path, fake_slurm):
    for status in (0, 1):
        proc = run_job("preemptible.sbatch", tmp_path, dry_run=False, path_prefix=fake_slurm,
                       TP=1, PP=1, DP=1, SLURM_NTASKS=1, SLURM_JOB_ID=42, FAKE_EXIT=status,
                       CKPT_DIR=tmp_path / "ckpt")
        assert proc.returncode == status
        assert "scontrol" not in proc.stdout


@pytest.fixture
def failing_node(tmp_path):
    """Stand-ins for a job on node1 and node2 that loses node2: the first srun fails (137) and from then
    on sinfo calls node2 down; every srun says how it was called, a later one prints a step and ends 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    failed = tmp_path / "failed"
    (bin_dir / "srun").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "srun $*"
        if [ ! -e {failed} ]; then touch {failed}; exit 137; fi
        echo "step     3/16  loss 3.4"
    """))
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "node1\\nnode2\\n"\n')
    (bin_dir / "sinfo").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
            *node2*%t*) [ -e {failed} ] && echo "down*" || echo alloc ;;
            *node2*%T*) echo "down*: Not responding" ;;
            *%t*) echo alloc ;;
        esac
    """))
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def test_resilient_goes_on_without_a_lost_node(tmp_path, failing_node):
    proc = run_job("resilient.sbatch", tmp_path, dry_run=False, path_prefix=failing_node, TP=4, PP=2,
                   SLURM_NTASKS=8, SLURM_JOB_NUM_NODES=2, SLURM_JOB_NODELIST="node[1-2]",
                   CKPT_DIR=tmp_path / "ckpt", SAVE_EVERY=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "== attempt 1: tp 4 x pp 2 x dp 1 = 8 ranks on node1 node2\n" in out
    assert "srun --mpi=pmi2 --ntasks=8 --wait=120 --nodes=2 --nodelist=node1,node2 hpcpar train --tp 4 --pp 2" in out
    assert f"--save {tmp_path}/ckpt --save-every 2 --keep 3 --resume {tmp_path}/ckpt --hang-timeout 120" in out
    assert "exit status 137 (killed by signal 9)" in out
    assert "== lost node2 (down*: Not responding), which held ranks 4-7 of attempt 1\n" in out
    # the planner's layout for the 4 ranks left, on node1 alone, sharing the failed step's CPUs
    plan = re.search(r"^== planner: tp (\d) x pp (\d) x dp (\d) for 4 ranks on 1 node\(s\)", out, re.M)
    assert plan and int(plan[1]) * int(plan[2]) * int(plan[3]) == 4, out
    assert "srun --mpi=pmi2 --ntasks=4 --wait=120 --nodes=1 --nodelist=node1 --overlap hpcpar train" in out
    assert re.search(r"^== first step after the failure at [0-9:]+: \d+ s after the failed attempt ended$", out, re.M)
    assert out.rstrip().endswith("exit status 0 (done)")
