"""The lessons (docs/course/NN-*.md): their order, the time a student needs, their picture, and the
discussion questions with the answers the instructor key prints (``hpcpar course key``).

Minutes are for a student who has done the lessons before: the reading, the run, and every exercise
of the lesson with a hint or two; the MPI and trainer exercises count their checks' minute of waiting.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    number: int
    page: str               # docs/course/
    title: str
    minutes: int
    picture: str = ""       # docs/course/img/, drawn by pictures.py (make docs)
    discuss: tuple = ()     # (question, answer) pairs: the lesson asks, the key answers


LESSONS = [
    Lesson(1, "01-one-rank.md", "one rank", 60, "01-causal-blocks.png", (
        ("Why can the last block of queries write dK and dV and the earlier ones only add into their first z rows?",
         "Block [a, z) touches keys [0, z) only. Processing blocks in reverse, the last block is the first to "
         "write every key row it touches; each earlier block's keys are a prefix the later blocks have "
         "already written, so it adds into rows 0 .. z - 1."),)),
    Lesson(2, "02-collectives.md", "collectives", 75, "02-ring-allreduce.png", (
        ("In the 4-rank demonstration, which element of the sum does each rank keep after the reduce-scatter?",
         "Rank r keeps block r of the sum: MPI's reduce-scatter hands block r to rank r. The ring of exercise 1 "
         "ends with chunk (r + 1) mod p on rank r instead: the same work, labelled otherwise."),
        ("Why does a blocking send at every rank at once hang with 1 MB chunks and not with 32 bytes?",
         "Small messages go eagerly into MPI's buffers and the send returns; past the eager limit a send waits "
         "for the matching receive, which every rank posts only after its own send returns."))),
    Lesson(3, "03-tensor-parallel.md", "tensor parallelism", 120, "03-tp-pair.png", (
        ("Which of dL/dx, dL/dW, dL/db can a column-parallel rank finish alone?",
         "dL/dW_i and dL/db_i: they need only x and its own columns of dy. dL/dx sums over all output "
         "columns, so the rank holds one term and f's all-reduce adds the others."),
        ("Where does the bias of a row-parallel layer go, and why?",
         "After the all-reduce, once: added before it, every rank's copy would be summed tp times."))),
    Lesson(4, "04-pipeline.md", "pipeline parallelism", 90, "04-gpipe.png", (
        ("Swap rank 0's B0 and F2 in the drawn schedule: what happens to the bubble and the peak?",
         "Running F2 before B0 keeps three micro-batches in flight on rank 0 (the peak rises to 3) and does not "
         "shorten the makespan: the bubble stays, the memory grows - GPipe's trade, not 1F1B's."),)),
    Lesson(5, "05-data-parallel.md", "data parallelism", 60, "05-zero1-bucket.png", (
        ("What does rank 7 of 8 update in a bucket of 5 numbers?",
         "Nothing real: each slice holds 1 number (5 padded to 8), and rank 7's is padding."),
        ("Why does --zero1 at dp 2 hand MPI 2.4 MB where plain data parallelism hands 1.6 MB, yet the wire "
         "carries the same?",
         "ZeRO-1 is a reduce-scatter (whole bucket handed) plus an all-gather (its slice handed): counted as "
         "payload that is 1.5x an all-reduce's; on the wire a ring all-reduce is exactly those two halves."))),
    Lesson(6, "06-3d.md", "all three at once", 45, "06-grid.png", ()),
    Lesson(7, "07-checkpoints.md", "checkpoints", 40, "", ()),
    Lesson(8, "08-tracing.md", "tracing and measuring", 90, "", (
        ("Why is pp 2 with 2 micro-batches slower than dp 2 on the same two ranks?",
         "The 1F1B bubble, (p - 1) / (m + p - 1) = 1/3 of the pipeline's device time, shows as time a stage "
         "waits in a receive ('comm pp' in the profile); dp 2 computes all the time and pays one gradient "
         "all-reduce, small for the tiny model."),)),
    Lesson(9, "09-context-parallel.md", "context parallelism", 100, "09-causal-balance.png", (
        ("Why does every rank take one early and one late chunk of the sequence?",
         "Causal attention's work grows with the position: a rank holding only the late chunk would do "
         "almost all of it. Chunks j and 2cp - 1 - j together cost the same on every rank."),)),
    Lesson(10, "10-llama.md", "Llama blocks", 90, "", (
        ("Why does tensor parallelism need no communication inside grouped-query attention, and why must tp "
         "divide the number of K/V heads?",
         "Each rank's query heads attend only with K/V heads of their own groups, and cutting both by "
         "consecutive runs keeps a group on one rank; tp must divide the K/V heads so that no group is split."),
        ("Why is a tensor-parallel rank's QK-norm gain gradient only a partial sum?",
         "The gain is shared by all heads, and each rank holds only its heads: the full dg sums every rank's "
         "share (an all-reduce over tp)."))),
    Lesson(11, "11-mixed-precision.md", "mixed precision", 40, "", (
        ("Why halve at once but grow only after many clean steps?",
         "An overflow wastes a whole step (it is skipped), so the scale must drop at the first one; a scale "
         "a little too small costs only some precision in the smallest gradients, so growth can wait until "
         "a run of clean steps says the larger scale is probably safe."),)),
    Lesson(12, "12-hangs.md", "debugging a hang", 45, "", ()),
    Lesson(13, "13-recomputation.md", "recomputation", 40, "", ()),
    Lesson(14, "14-zero.md", "ZeRO-3", 60, "", ()),
    Lesson(15, "15-v-pipelines.md", "V-shaped pipelines", 75, "15-zb-h1.png", (
        ("Why may ZB-V postpone a W but not a B?",
         "The previous stage waits for B (the input gradient); nobody waits for W, which only adds into this "
         "rank's weight gradients - but until it runs, its micro-batch's activations stay in memory."),)),
    Lesson(16, "16-all-to-all.md", "all-to-all", 120, "16-all-to-all.png", (
        ("Does the router's balance change the bytes a rank hands the expert all-to-alls? Does ep?",
         "No and no: a rank hands MPI all of its tokens' rows, k per token, wherever they go; balance and ep "
         "change only how many leave the rank and how evenly the receivers are loaded."),
        ("What is the backward of the Ulysses transpose?",
         "Its inverse: the head cut back to the sequence cut (it only moves numbers)."))),
    Lesson(17, "17-muon.md", "Muon", 75, "", (
        ("Why may every rank of a tensor-parallel group run Newton-Schulz on the whole matrix (duplicated), and "
         "when is the distributed mode cheaper?",
         "The whole update is a few kilobytes to megabytes, gathered once, and every rank then computes the same "
         "numbers, so their shards of the result agree. Distributed sends steps + 1 small Grams instead of the "
         "matrix and does 1/tp of the long side's products on each rank: cheaper when the cut side is the long "
         "one (the Gram is the short side squared), dearer when the Gram is the long side's."),
        ("Why does every rank hand MPI the same numbers under whole-tensor ownership, however unevenly the "
         "matrices fall?",
         "A buffer is cut into n equal ranges, each as long as the fullest rank's share: every rank hands the "
         "reduce-scatter the whole buffer and the all-gather one range - the others' ranges end in padding. "
         "Uneven matrices cost padding (memory and bytes), not unequal messages."),
        ("Why does Muon give Q, K and V of a fused c_attn a Newton-Schulz each?",
         "They are three maps with unrelated scales; orthogonalised together, the largest of them sets the "
         "normalisation and the coupling between them in the Gram mixes their directions - the published recipes "
         "hold them as three matrices, and hpcpar's result must equal theirs."))),
    Lesson(18, "18-next.md", "what comes next", 20, "", ()),
]
BY_PAGE = {lesson.page: lesson for lesson in LESSONS}
