"""Exercise 33, measuring (docs/course/08-tracing.md): two layouts of one job on this machine, profiled,
the faster predicted and explained.

The job is the tiny GPT in float32 on 2 ranks, once as a 2-stage pipeline with 2 micro-batches and
once as 2 data-parallel replicas.  The student runs both (``--profile --summary-json``), reads the
pipeline's simulated bubble (the simulator the planner uses for every schedule), and writes down the
two median steps, the bubble measured and simulated, the faster layout and why.

Machines differ and may be busy, so the check never compares with fixed times: it runs both layouts
itself, in the same check, and holds the student's figures to its own - the ratio of the two steps
within a factor of RATIO_SLACK, the measured bubble within BUBBLE_SLACK, the faster layout the one it
measures faster unless the two lie within TIE of each other - and the simulated bubble, which no
machine changes, to 1 %.
"""
import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

from hpcpar.course.wrong import Wrong

LAYOUTS = {"pp2": ["--pp", "2", "--microbatches", "2"], "dp2": ["--dp", "2"]}
RUN = ["--model", "tiny", "--dtype", "float32", "--steps", "8", "--no-progress"]
WHY = ("bubble", "communication volume", "smaller GEMMs", "memory")
RATIO_SLACK, BUBBLE_SLACK, TIE = 1.6, 0.2, 1.15


def simulated_bubble():
    """1F1B on 2 stages with 2 micro-batches and no split backward: (p - 1) / (m + p - 1) whatever F and B."""
    from hpcpar.pipeline.schedules import build
    from hpcpar.pipeline.simulate import simulate
    return float(simulate(build("1f1b", 2, 2)).bubble)


def _run(layout, folder):
    from hpcpar import launch
    out = Path(folder) / f"{layout}.json"
    cmd = launch.mpiexec() + ["-n", "2", sys.executable, "-m", "hpcpar", "train"] + RUN + LAYOUTS[layout] + \
        ["--summary-json", str(out)]
    status, _ = launch.run_job(cmd, Path(folder) / f"{layout}.log", 300)
    if status != 0:
        raise RuntimeError(f"the check's own run of {layout} failed (status {status}): "
                           + (Path(folder) / f"{layout}.log").read_text()[-300:])
    return json.loads(out.read_text())


@functools.lru_cache(maxsize=1)
def measure():
    """This machine, now: {layout: median ms per step}, and pp 2's measured bubble; each layout run twice,
    alternating, its faster run kept (other jobs only ever slow a run down).  Once per process."""
    ms, bubble = {}, []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(2):
            for layout in LAYOUTS:
                summary = _run(layout, folder)
                ms.setdefault(layout, []).append(1e3 * summary["step_time_s"])
                if layout == "pp2":
                    bubble.append(summary["bubble_measured"])
    return {k: min(v) for k, v in ms.items()}, statistics.median(bubble)


def measured_answer():
    """Reference: the check's own figures, as a student would write them down."""
    ms, bubble = measure()
    faster = min(ms, key=ms.get)
    return dict(ms_per_step=ms, bubble=dict(measured=bubble, simulated=simulated_bubble()), faster=faster,
                why="bubble" if faster == "dp2" else "communication volume")


def check_measurement(answer, measured=None):
    if not (isinstance(answer, dict) and {"ms_per_step", "bubble", "faster", "why"} <= set(answer)):
        raise Wrong("ANSWER is a dict with ms_per_step, bubble, faster and why (the template shows its form)")
    ms, bubble = answer["ms_per_step"], answer["bubble"]
    if not (isinstance(ms, dict) and set(ms) == set(LAYOUTS) and all(isinstance(v, (int, float)) and v > 0
                                                                        for v in ms.values())):
        raise Wrong(f"ms_per_step maps {' and '.join(LAYOUTS)} to the median milliseconds of a step, got {ms!r}")
    if not (isinstance(bubble, dict) and {"measured", "simulated"} <= set(bubble)):
        raise Wrong("bubble holds pp 2's measured and simulated bubble, as fractions")
    if abs(bubble["simulated"] - simulated_bubble()) > 0.01:
        raise Wrong(f"the simulated bubble, {bubble['simulated']!r}, is not the simulator's: it depends on p and m "
                    "only here (as a fraction of device time, not a percentage)")
    if answer["why"] not in WHY:
        raise Wrong(f"why is one of {', '.join(map(repr, WHY))}, got {answer['why']!r}")
    if answer["faster"] not in LAYOUTS:
        raise Wrong(f"faster is 'pp2' or 'dp2', got {answer['faster']!r}")
    here, here_bubble = measured or measure()
    ratio, here_ratio = ms["pp2"] / ms["dp2"], here["pp2"] / here["dp2"]
    if not 1 / RATIO_SLACK <= ratio / here_ratio <= RATIO_SLACK:
        raise Wrong(f"your pp 2 takes {ratio:.2f}x your dp 2; measured in this check, {here_ratio:.2f}x - further "
                    f"apart than a busy machine explains ({RATIO_SLACK}x): measure again, the median step of each")
    if abs(bubble["measured"] - here_bubble) > BUBBLE_SLACK:
        raise Wrong(f"pp 2's measured bubble, {bubble['measured']:.2f}, is far from this check's {here_bubble:.2f}: "
                    "read the summary's 'bubble measured' line (a fraction of the pipeline's time)")
    clear = max(here_ratio, 1 / here_ratio) > TIE
    if clear and answer["faster"] != min(here, key=here.get):
        raise Wrong(f"{answer['faster']} is not the faster layout here: this check measures pp 2 at {here_ratio:.2f}x "
                    "dp 2")
    if clear and here_ratio > 1 and answer["why"] != "bubble":
        raise Wrong(f"{answer['why']!r} is not what makes pp 2 slower here: compare its profile with dp 2's, line "
                    "by line, and the measured bubble with the simulated one")
