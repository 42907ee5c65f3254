"""The planner's search at full size: GPT-3 175B on 1024 A100s (the goal: at most 3 s of CPU).

The command ``hpcpar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100
--global-batch 1536 --seq-len 2048`` less its printing: the search (every layout whose shapes divide,
each with its memory and analytic step; the best simulated) and the table's communication share of
the ten it lists.  A fresh process per round would time the imports too; the caches of the search
(bubble.py) are emptied before every round instead, so each round does all of the work again.
CPU seconds (the search is one thread) and wall seconds, with the load average beside them: on a
busy machine the wall time is the CPU time stretched by the share of a core the process got.
"""
import os
import time

from hpcpar.tools.bench.common import Result

COMMAND = ("hpcpar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100 --global-batch 1536 "
           "--seq-len 2048")
TARGET_S = 3.0
SHOWN = 10         # rows of the command's table


def plan_once():
    """One search as the command runs it; returns the number of layouts it considered."""
    from hpcpar.tools.plan.bubble import clear_caches
    from hpcpar.tools.plan.hardware import load_hardware
    from hpcpar.tools.plan.job import Job
    from hpcpar.tools.plan.models import load_model
    from hpcpar.tools.plan.search import Space, search
    clear_caches()
    job = Job(load_model("gpt3-175b"), load_hardware("a100"), 1024, 8, 1536, 2048)
    ranking = search(job, Space(fixed=(("cp", 1),)), refine=max(40, 2 * SHOWN))
    sum(e.comm for e in ranking.estimates[:SHOWN])
    return ranking.considered


def run(quick):
    rounds = 1 if quick else 3
    cpu, wall, loads = [], [], []
    for _ in range(rounds):
        loads.append(os.getloadavg()[0])
        c0, w0 = time.process_time(), time.perf_counter()
        considered = plan_once()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    res = Result()
    res.table("The planner's search: GPT-3 175B, 1024 A100s, batch 1536 x 2048",
              ["layouts considered", "CPU s (best round)", "wall s (best round)", "load average (1 min)"],
              [[considered, f"{min(cpu):.2f}", f"{min(wall):.2f}", f"{min(loads):.1f}"]],
              notes=[f"`{COMMAND}` without its printing; {rounds} round(s), caches emptied before each."])
    res.figures = {"cpu_s": cpu, "wall_s": wall, "load_1min": loads, "considered": considered}
    res.target("hpcpar plan, GPT-3 175B on 1024 GPUs", f"<= {TARGET_S:g} s", f"{min(cpu):.2f} s CPU",
               min(cpu) <= TARGET_S)
    return res
