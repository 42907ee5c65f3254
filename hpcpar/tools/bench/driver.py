"""The serial driver of ``hpcpar bench``: each benchmark in its own process, results to JSON and Markdown.

A benchmark that needs ranks runs as ``mpiexec -n N python -m hpcpar.tools.bench NAME`` with the launcher
the Makefile and the tests use (``HPCPAR_MPIEXEC``, else the ``mpiexec`` beside this Python), through
launch.run_job (a hung job is ended as a whole).  Every process gets one BLAS/OpenMP
thread (the benchmarks compare one core against one core); every other variable, ``OPENBLAS_CORETYPE``
included, is passed on as it is and listed in the machine table.  A benchmark that fails or hangs is
reported as such; the others still run.
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hpcpar.tools.bench import BENCHMARKS
from hpcpar.tools.bench.machine import describe
from hpcpar.tools.bench.report import markdown
from hpcpar.launch import mpiexec, run_job, single_thread_env


def one_thread_each():
    """The benchmarks' processes inherit this process's environment: one BLAS/OpenMP thread each."""
    os.environ.update(single_thread_env())


def _tail(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def run_one(name, ranks, quick):
    """One process (or MPI job) of benchmark ``name``: its result dict, with how it ran."""
    spec = BENCHMARKS[name]
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "output.log"
        cmd = ([*mpiexec(), "-n", str(ranks)] if ranks else []) + \
            [sys.executable, "-m", "hpcpar.tools.bench", name, "--out", str(out)] + (["--quick"] if quick else [])
        saved = {k: os.environ.get(k) for k, _ in spec.env}
        os.environ.update(spec.env)
        try:
            status, seconds = run_job(cmd, log, spec.timeout)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        error = None if status == 0 and out.exists() else \
            f"did not finish within {spec.timeout} s" if status is None else \
            f"exit status {status}:\n{_tail(log.read_text(errors='replace'))}"
        result = json.loads(out.read_text()) if error is None else {"tables": [], "figures": {}, "targets": [],
                                                                     "notes": [], "error": error}
    shown = [f"{k}={v}" for k, v in spec.env] + (["mpiexec", "-n", str(ranks)] if ranks else [])
    result.update(ranks=ranks or 1, seconds=seconds,
                  command=" ".join(shown + ["python", "-m", "hpcpar.tools.bench", name] + (["--quick"] if quick else [])))
    return result


def run(names, quick=False, out_json=None, markdown_path=None, command="hpcpar bench", log=print):
    """Run ``names`` in order; write the JSON and Markdown files. Returns the report dict."""
    one_thread_each()
    started = time.monotonic()
    report = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "quick": quick,
              "machine": describe(" ".join(mpiexec()), os.environ), "benchmarks": {}}
    for name in names:
        spec = BENCHMARKS[name]
        runs = []
        for ranks in spec.world_sizes(quick):
            result = run_one(name, ranks, quick)
            state = "FAILED" if "error" in result else "ok"
            ranks = f"({result['ranks']} rank{'s' if result['ranks'] > 1 else ''})"
            log(f"hpcpar bench: {name:<15} {ranks:<10} {result['seconds']:6.1f} s  {state}")
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
