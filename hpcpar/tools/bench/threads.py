"""(th) The README's first run with the threads hpcpar chooses against one BLAS thread, idle and busy.

``hpcpar train --model tiny`` exactly as the README gives it, with no thread variable set (hpcpar
chooses: launch.choose_threads), against the same command with ``OPENBLAS_NUM_THREADS=1``; first on
the machine as it is, then with six busy processes beside it (pure-Python spinning loops, each wanting
a whole core).  Spinning BLAS threads that find their cores taken collapse: before hpcpar chose, the
run with nothing set took 2.0x the one-thread time with six busy processes beside it on 2 cores.
Target: at most 1.5x, idle and busy.  The runs alternate, and each case keeps its fastest run; the
figure is the median step time of hpcpar train's own summary (wall clock, steps after the first).
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcpar.tools.bench.common import Result, ms, ratio
from hpcpar.launch import THREAD_VARS, first_error, run_job

BUSY = 6                 # processes beside the run in the busy case
AS_IT_IS = "as it is (idle unless others run jobs)"
TARGET = 1.5


@contextlib.contextmanager
def busy_processes(n):
    """``n`` processes that each keep a core busy until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def thread_setting(value):
    """The thread variables as the README's user has them: none set (None), or OPENBLAS_NUM_THREADS."""
    saved = {var: os.environ.pop(var, None) for var in THREAD_VARS}
    if value is not None:
        os.environ["OPENBLAS_NUM_THREADS"] = value
    try:
        yield
    finally:
        for var, v in saved.items():
            os.environ.pop(var, None)
            if v is not None:
                os.environ[var] = v


def first_run(steps, tmp, tag):
    """The README's first run, shortened to ``steps``: (median step seconds, threads line of its summary)."""
    summary, log = Path(tmp) / f"{tag}.json", Path(tmp) / f"{tag}.log"
    cmd = [sys.executable, "-m", "hpcpar", "train", "--model", "tiny", "--steps", str(steps), "--metrics",
           str(Path(tmp) / f"{tag}.jsonl"), "--no-progress", "--summary-json", str(summary)]
    status, _ = run_job(cmd, log, 900)
    if status != 0:
        raise RuntimeError(f"{tag}: {first_error(log)}")
    threads = next((line.strip().removeprefix("threads").strip() for line in log.read_text().splitlines()
                    if line.strip().startswith("threads")), "")
    return json.loads(summary.read_text())["step_time_s"], threads


def run(quick):
    steps, rounds = (6, 1) if quick else (60, 2)
    cases = {"nothing set": None, "OPENBLAS_NUM_THREADS=1": "1"}
    best, chosen = {}, {}
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-threads-") as tmp:
        for load, busy in ((AS_IT_IS, 0), (f"{BUSY} busy processes added", BUSY)):
            with busy_processes(busy):
                for r in range(rounds):
                    for name in (list(cases) if r % 2 == 0 else list(cases)[::-1]):
                        with thread_setting(cases[name]):
                            seconds, threads = first_run(steps, tmp, f"{busy}.{r}.{name[:7]}")
                        key = (load, name)
                        best[key] = min(best.get(key, seconds), seconds)
                        chosen[key] = threads
    res = Result()
    rows, figures = [], {}
    for load in (AS_IT_IS, f"{BUSY} busy processes added"):
        mine, one = best[(load, "nothing set")], best[(load, "OPENBLAS_NUM_THREADS=1")]
        rows.append([load, ms(mine), ms(one), ratio(mine / one), chosen[(load, "nothing set")]])
        figures[load] = {"nothing_set_s": mine, "one_thread_s": one, "ratio": mine / one}
        res.target(f"README's first run, nothing set / OPENBLAS_NUM_THREADS=1, {load}", f"<= {TARGET}x",
                   ratio(mine / one), mine / one <= TARGET)
    res.table(f"The README's first run (hpcpar train --model tiny, {steps} steps): hpcpar's thread choice "
              "against one BLAS thread",
              ["machine", "nothing set", "OPENBLAS_NUM_THREADS=1", "ratio", "what hpcpar chose (nothing set)"], rows,
              [f"Median step time of the run's own summary; each case ran {rounds} times, alternating, and keeps "
               "its fastest run.  'busy': pure-Python loops spinning beside the run, one core each.",
               f"This machine's cores: {len(os.sched_getaffinity(0))}; other users' jobs, if any, count as busy "
               "too (hpcpar counts them when it chooses)."])
    res.figures = figures
    return res
