"""Exercise 20, a solution: dynamic loss scaling."""


def next_scale(scale, good_steps, grads_finite, growth_interval):
    if not grads_finite:
        return scale / 2, 0, False
    good_steps += 1
    if good_steps == growth_interval:
        return scale * 2, 0, True
    return scale, good_steps, True
