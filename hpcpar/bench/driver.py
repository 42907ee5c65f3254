"""The serial driver of ``hpcpar bench``: each benchmark in its own process, results to JSON and Markdown.

A benchmark that needs ranks runs as ``mpiexec -n N python -m hpcpar.bench NAME`` with the launcher
the Makefile and the tests use (``HPCPAR_MPIEXEC``, else the ``mpiexec`` beside this Python).  Every
process gets one BLAS/OpenMP thread (the benchmarks compare one core against one core); every other
variable, ``OPENBLAS_CORETYPE`` included, is passed on as it is and listed in the machine table.
A benchmark that fails or hangs is reported as such; the others still run.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcpar.bench import BENCHMARKS
from hpcpar.bench.machine import describe
from hpcpar.bench.report import markdown

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def launcher():
    return shlex.split(os.environ.get("HPCPAR_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec"))


def child_env():
    env = dict(os.environ)
    env.update({var: "1" for var in THREAD_VARS})
    return env


def _tail(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def run_one(name, ranks, quick, env):
    """One process (or MPI job) of benchmark ``name``: its result dict, with how it ran."""
    spec = BENCHMARKS[name]
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = ([*launcher(), "-n", str(ranks)] if ranks else []) + \
            [sys.executable, "-m", "hpcpar.bench", name, "--out", str(out)] + (["--quick"] if quick else [])
        start = time.monotonic()
        # a session of its own, so that a hung MPI job can be ended as a whole (launcher and ranks)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=spec.timeout)
            error = None if proc.returncode == 0 and out.exists() else \
                f"exit status {proc.returncode}:\n{_tail(output)}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            error = f"did not finish within {spec.timeout} s"
        result = json.loads(out.read_text()) if error is None else {"tables": [], "figures": {}, "targets": [],
                                                                     "notes": [], "error": error}
    shown = ["mpiexec", "-n", str(ranks)] if ranks else []
    result.update(ranks=ranks or 1, seconds=time.monotonic() - start,
                  command=" ".join(shown + ["python", "-m", "hpcpar.bench", name] + (["--quick"] if quick else [])))
    return result


def run(names, quick=False, out_json=None, markdown_path=None, command="hpcpar bench", log=print):
    """Run ``names`` in order; write the JSON and Markdown files. Returns the report dict."""
    env = child_env()
    started = time.monotonic()
    report = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "quick": quick,
              "machine": describe(" ".join(launcher()), env), "benchmarks": {}}
    for name in names:
        spec = BENCHMARKS[name]
        runs = []
        for ranks in spec.world_sizes(quick):
            result = run_one(name, ranks, quick, env)
            state = "FAILED" if "error" in result else "ok"
            log(f"hpcpar bench: {name:<15} {'(' + str(result['ranks']) + ' ranks)':<11} "
                f"{result['seconds']:6.1f} s  {state}")
            runs.append(result)
        report["benchmarks"][name] = {"label": spec.label, "title": spec.title, "runs": runs}
    report["seconds"] = time.monotonic() - started
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(report, indent=1) + "\n")
    if markdown_path:
        Path(markdown_path).write_text(markdown(report))
    return report


def failures(report):
    return [name for name, b in report["benchmarks"].items() for r in b["runs"] if "error" in r]
