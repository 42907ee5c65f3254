"""Pipeline exercises: the busy and total device time of a schedule, and the 1F1B order."""
from hpcpar.course.exercise import Wrong
from hpcpar.pipeline.schedules import build
from hpcpar.pipeline.simulate import simulate


def busy_of_total():
    """Reference: 4 stages, 4 micro-batches, forwards only, one time unit each (hpcpar schedule)."""
    result = simulate(build("1f1b", 4, 4, forward_only=True))
    return sum(result.busy), result.device_time()


def check_busy_of_total(answer):
    want = busy_of_total()
    if not (isinstance(answer, tuple) and len(answer) == 2):
        raise Wrong(f"ANSWER is a pair (busy units, total units), got {answer!r}")
    busy, total = answer
    if busy != want[0]:
        raise Wrong(f"busy {busy}: every device runs one forward per micro-batch, 1 unit each")
    if total != want[1]:
        raise Wrong(f"total {total}: the last micro-batch leaves the last stage after m + p - 1 units, and "
                    "every device counts for that whole time. Measure: .venv/bin/hpcpar schedule --stages 4 "
                    "--microbatches 4 --forward-only")


def one_f_one_b(stage, stages, microbatches):
    """Reference: the package's 1F1B order of ``stage`` as ("F", mb) / ("B", mb) pairs."""
    return [(a.op, a.mb) for a in build("1f1b", stages, microbatches).actions[stage]]


def check_one_f_one_b(f):
    for p, m in ((4, 8), (4, 4), (2, 5), (4, 2), (1, 3)):
        for stage in range(p):
            want = one_f_one_b(stage, p, m)
            got = [tuple(a) for a in f(stage, p, m)]
            if sorted(got) != sorted(want):
                raise Wrong(f"p={p}, m={m}, stage {stage}: every micro-batch needs one F and one B, got {got}")
            if got != want:
                warm = min(p - stage - 1, m)
                raise Wrong(f"p={p}, m={m}, stage {stage}: the order is {got}, expected {want}: stage s "
                            f"first runs p - s - 1 = {warm} warm-up forwards, then alternates F, B, then "
                            "drains the remaining B")
    result = simulate(build("1f1b", 4, 8))
    if max(result.peak_inflight) > 4:
        raise Wrong("the schedule holds more than p micro-batches' activations")
