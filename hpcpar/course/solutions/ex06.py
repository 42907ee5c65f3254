"""Exercise 6, a solution: the 1F1B order of one stage."""


def one_f_one_b(stage, stages, microbatches):
    warmup = min(stages - 1 - stage, microbatches)
    order = [("F", mb) for mb in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", mb) for mb in range(microbatches - warmup, microbatches)]
