"""Exercise 40, a solution: where the MTP modules sit, and which gradients the pipeline's ends sum."""


def pipeline_ends(pp, schedule, chunks, mtp):
    if schedule in ("zb-v", "dualpipev"):           # the V comes back: rank 0 holds the last stage too
        first, last, last_chunk = 0, 0, 1
    else:                                           # the last virtual stage is the last rank's last chunk
        first, last, last_chunk = 0, pp - 1, chunks - 1
    at = (last, last_chunk) if mtp else None
    # the modules look tokens up in the embedding: a copy on the last stage, its gradient summed with the
    # first stage's, unless one rank holds both ends; the copy is not counted in the norm
    summed = {"embed_tokens.weight": (first, last)} if mtp and first != last else {}
    return at, summed, (first,)
