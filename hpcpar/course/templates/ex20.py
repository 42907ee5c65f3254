"""Exercise 20 (docs/course/11-mixed-precision.md): dynamic loss scaling.

In float16 small gradients underflow to 0, so the loss is multiplied by a scale before the backward
(and the gradients divided by it after).  Too large a scale overflows: some gradient is inf or nan.
The scale adapts after every step:

    scale, good_steps   the scale just used, and how many clean steps in a row came before this one
    grads_finite        whether this step's scaled gradients were all finite
    growth_interval     how many clean steps in a row double the scale

Return (the scale for the next step, the new good_steps, whether this step's update is applied).

Check: .venv/bin/hpcpar course check 20
"""


def next_scale(scale, good_steps, grads_finite, growth_interval):
    raise NotImplementedError
