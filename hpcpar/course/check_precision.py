"""Mixed-precision exercise: dynamic loss scaling's rule (hpcpar/precision.py LossScaler)."""
from hpcpar.course.wrong import Wrong
from hpcpar.precision import LossScaler


def next_scale(scale, good_steps, grads_finite, growth_interval):
    """Reference: (the scale for the next step, clean steps counted since the last change, whether this
    step's update is applied) after a step whose scaled gradients were finite or not."""
    scaler = LossScaler(True, scale, growth_interval)
    scaler.good_steps = good_steps
    scaler.update(grads_finite)
    return scaler.scale, scaler.good_steps, grads_finite


def check_next_scale(f):
    # (growth interval, start scale, steps): from 2^16 as the trainer starts, and from 4, where overflows in
    # a row take the scale below 1 - a halving that is not a true division stops training there
    runs = [(3, 2.0 ** 16, "ok ok ok ok ok ok ok"), (3, 2.0 ** 16, "ok inf ok ok ok inf inf ok"),
            (2, 2.0 ** 16, "inf inf inf ok ok ok ok ok"), (1, 2.0 ** 16, "ok ok inf ok"),
            (4, 2.0 ** 16, "ok ok ok inf ok ok ok ok ok"), (2, 4.0, "inf inf inf inf ok ok ok ok"),
            (3, 3.0, "inf ok ok ok")]
    for interval, start, flags in runs:
        got_state = want_state = (start, 0)
        for i, flag in enumerate(flags.split()):
            finite = flag == "ok"
            got = tuple(f(*got_state, finite, interval))
            want = next_scale(*want_state, finite, interval)
            if len(got) != 3:
                raise Wrong("return (scale, good_steps, apply_update)")
            for name, g, w in zip(("scale", "good_steps", "apply_update"), got, want):
                if g != w:
                    raise Wrong(f"growth interval {interval}, scale {start:g}, steps {' '.join(flags.split()[:i + 1])}: after step "
                                f"{i + 1} ({'finite' if finite else 'overflow'}) {name} is {g}, expected {w}")
            got_state, want_state = got[:2], want[:2]
