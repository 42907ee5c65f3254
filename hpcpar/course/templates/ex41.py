"""Exercise 41 (docs/course/12-hangs.md): going on without a rank - the survivors' places, and who sends whom
which piece of the model state.

A job ran on tp x pp x dp = `old` ranks in hpcpar's order (exercise 8: rank = tp_i + tp (dp_i + dp pp_i)),
with AdamW and ZeRO 0, when the ranks `dead` died.  The survivors shrink the world: they keep their order
and are numbered 0, 1, ... again (their new ranks); the first of them take the layout `new` = (tp, pp, dp)
that the planner chose, in the same order, and any left over wait idle.

The state is named as in a checkpoint: a piece is (key, part).  A key is a tensor's name, or
"optimizer/exp_avg/" or "optimizer/exp_avg_sq/" and the name for its two AdamW moments.  `tensors` maps each
name to whether tensor parallelism cuts it: then tp_i of the old grid holds part tp_i (of the old tp parts),
of the weight and of its moments alike; a tensor it does not cut is part 0 (of 1) on every tp rank.  A rank
holds the tensors of its pipeline stage: `stage(name, pp)` is the stage that holds `name` when the model is
cut into pp stages.  Every rank of the new layout needs every part of every key of its new stage (it
assembles each whole tensor and cuts its own shard, as a resume would).

Return (places, plan):

    places  {old rank of each survivor: (new rank, (tp_i, pp_i, dp_i) in the new grid, or None when idle)}
    plan    [(source, destination, key, part)], sources and destinations new ranks: one entry for each
            piece each rank of the new layout needs - destinations in increasing order, then keys in sorted
            order, then parts in increasing order; the source is the destination itself when it holds the
            piece, else the survivor holding it that is the source of the fewest entries so far (an entry
            to itself not counted; the lower new rank on a tie)

`me` is the new rank computing the plan: every survivor calls the function, and the exchange that carries
out the plan tags each message with its place in the list.

Check: .venv/bin/hpcpar course check 41
"""


def recovery_plan(old, dead, new, tensors, stage, me):
    """-> (places, plan)"""
    raise NotImplementedError
