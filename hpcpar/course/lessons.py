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
    Lesson(9, "09-context-parallel.md", "context parallelism, and documents", 150, "09-causal-balance.png", (
        ("Why does every rank take one early and one late chunk of the sequence?",
         "Causal attention's work grows with the position: a rank holding only the late chunk would do "
         "almost all of it. Chunks j and 2cp - 1 - j together cost the same on every rank."),
        ("Why does a block that a rank skips still travel on round the ring?",
         "The ring passes every block through every rank: the next rank's queries may see the keys this one "
         "skips. Skipping saves the block's compute, not its message; to save the message every rank would "
         "need the plan of the others, and the hop would still be needed for the ranks further on."),
        ("Which target does --documents leave out of the loss, and why would keeping it teach the model nothing?",
         "The target of a document's last token, its <|endoftext|>: the next document's first token. The "
         "input sees only the document that ended, which says nothing about the unrelated one that follows "
         "in the shuffled stream. The end-of-text token itself stays a target: a text's end is predictable."))),
    Lesson(10, "10-llama.md", "Llama blocks, and latent attention", 120, "", (
        ("Why does tensor parallelism need no communication inside grouped-query attention, and why must tp "
         "divide the number of K/V heads?",
         "Each rank's query heads attend only with K/V heads of their own groups, and cutting both by "
         "consecutive runs keeps a group on one rank; tp must divide the K/V heads so that no group is split."),
        ("Why is a tensor-parallel rank's QK-norm gain gradient only a partial sum?",
         "The gain is shared by all heads, and each rank holds only its heads: the full dg sums every rank's "
         "share (an all-reduce over tp)."),
        ("Why does MLA cache a rotary key beside its latent, one for all the heads, instead of rotating keys "
         "made from the latent?",
         "Generation attends from the latent without expanding it: W_uk folds into the query, which works "
         "only if nothing depending on the key's position sits between the latent and the score. A rotation "
         "of the up-projected key would, so the position goes into a small key of its own (64 numbers in V3), "
         "rotated once, cached as is and shared by every head."))),
    Lesson(11, "11-mixed-precision.md", "mixed precision", 95, "", (
        ("Why halve at once but grow only after many clean steps?",
         "An overflow wastes a whole step (it is skipped), so the scale must drop at the first one; a scale "
         "a little too small costs only some precision in the smallest gradients, so growth can wait until "
         "a run of clean steps says the larger scale is probably safe."),
        ("Why does one rank's amax of a row-parallel layer's activations give other losses than one rank alone?",
         "Its row is only part of the row one rank holds: its maximum can be smaller, its scale larger, and "
         "every value is rounded on another grid; the max over the tp group restores the whole row's scale."),
        ("Why do data-parallel replicas not all-reduce their activations' amax?",
         "Each replica's micro-batch is a tensor of its own, scaled on its own as on one GPU; the equality "
         "holds against one rank that runs the same micro-batches one after the other."))),
    Lesson(12, "12-hangs.md", "debugging a hang, going on without a rank", 105, "", (
        ("Why must every survivor compute the same transfer list, in the same order - and how can they, "
         "without a message more than the one that tells everyone what everyone holds?",
         "The exchange posts a receive and a send for each entry, tagged with its place in the list: a rank "
         "with another list waits for a message nobody sends. Each survivor computes the list from the same "
         "allgathered inventory with a pure function - sorted destinations, keys and parts, a tie rule by "
         "rank, nothing that depends on the rank computing it or on a set's order in that process."),)),
    Lesson(13, "13-recomputation.md", "recomputation", 40, "", ()),
    Lesson(14, "14-zero.md", "ZeRO-3", 60, "", ()),
    Lesson(15, "15-v-pipelines.md", "V-shaped pipelines", 105, "15-zb-h1.png", (
        ("Why may ZB-V postpone a W but not a B?",
         "The previous stage waits for B (the input gradient); nobody waits for W, which only adds into this "
         "rank's weight gradients - but until it runs, its micro-batch's activations stay in memory."),
        ("A V puts the embedding and the MTP modules on one rank: what does that save every step, and what "
         "does it cost that rank?",
         "It saves the embedding's copy on the last stage (vocabulary x hidden numbers, with their optimizer "
         "state) and the sum of its gradient between the two ends after every backward. Rank 0 then holds "
         "the input embedding, the head, the loss and the MTP modules together: the partition must give it "
         "fewer blocks, or it sets the pace of the whole pipeline."),)),
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
