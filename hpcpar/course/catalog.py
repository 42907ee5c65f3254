"""The exercises in lesson order (docs/course/): what each asks, its check, its reference."""
from hpcpar.course import check_3d, check_dp, check_pp, check_state, check_tp
from hpcpar.course.collectives import ring_allreduce
from hpcpar.course.exercise import Exercise

EXERCISES = [
    Exercise(1, "02-collectives.md", "DP", "a ring all-reduce: reduce-scatter, then all-gather",
             "ring_allreduce", check_dp.check_ring_allreduce, ring_allreduce),
    Exercise(2, "03-tensor-parallel.md", "TP", "the column-parallel layer's backward",
             "column_parallel_backward", check_tp.check_column_backward, check_tp.column_parallel_backward),
    Exercise(3, "03-tensor-parallel.md", "TP", "the row-parallel layer's forward",
             "row_parallel_forward", check_tp.check_row_forward, check_tp.row_parallel_forward),
    Exercise(4, "03-tensor-parallel.md", "TP", "predict: MiB of activation all-reduces per rank and step, tp 2",
             "ANSWER", check_tp.check_allreduce_mib, check_tp.activation_allreduce_mib),
    Exercise(5, "04-pipeline.md", "PP", "predict: busy and total device time units of a 4-stage pipeline",
             "ANSWER", check_pp.check_busy_of_total, check_pp.busy_of_total),
    Exercise(6, "04-pipeline.md", "PP", "the 1F1B order of one stage",
             "one_f_one_b", check_pp.check_one_f_one_b, check_pp.one_f_one_b),
    Exercise(7, "05-data-parallel.md", "DP", "the slice of a bucket ZeRO-1 gives each rank",
             "zero1_shard", check_dp.check_zero1_shard, check_dp.zero1_shard),
    Exercise(8, "06-3d.md", "3D", "a rank's (tp, pp, dp) coordinates",
             "coords", check_3d.check_coords, check_3d.coords),
    Exercise(9, "06-3d.md", "3D", "predict: pipeline hops that cross nodes, tp 4 x pp 2 x dp 2 on 2 nodes",
             "ANSWER", check_3d.check_crossing_hops, check_3d.crossing_hops),
    Exercise(10, "07-checkpoints.md", "checkpoints", "resharding a tensor to another tp",
             "reshard", check_state.check_reshard, check_state.reshard),
    Exercise(11, "08-tracing.md", "tracing", "the bubble of a traced step",
             "bubble", check_state.check_bubble, check_state.bubble),
    Exercise(12, "08-tracing.md", "tracing", "the share of communication hidden behind compute",
             "hidden_share", check_state.check_hidden_share, check_state.hidden_share),
]
BY_NUMBER = {e.number: e for e in EXERCISES}
