"""The exercises (docs/course/): what each asks, its check, its reference, its hints.  Numbered in the
order they joined the course; each lesson names its own."""
from hpcpar.course import (check_3d, check_a2a, check_attention, check_cp, check_dp, check_hangs, check_llama,
                           check_memory, check_pp, check_precision, check_state, check_tp, check_v, check_zero)
from hpcpar.course.collectives import ring_allreduce
from hpcpar.course.exercise import Exercise
from hpcpar.ops.ring_attention import merge
from hpcpar.ops.rope import rope_backward

EXERCISES = [
    Exercise(1, "02-collectives.md", "DP", "a ring all-reduce: reduce-scatter, then all-gather",
             "ring_allreduce", check_dp.check_ring_allreduce, ring_allreduce, hints=(
                 "cut every rank's array into p chunks of n/p numbers (x.reshape(p, -1) gives views)",
                 "reduce-scatter, step s = 0 .. p-2: rank r sends its chunk (r - s) mod p to rank r+1, which "
                 "adds it to its own copy of that chunk",
                 "after p - 1 steps rank r holds the whole sum of chunk (r + 1) mod p; all-gather, step s: rank r "
                 "sends chunk (r + 1 - s) mod p, and the receiver overwrites its copy",
                 "send a chunk before any rank adds into it in the same step (all sends of a step, then all "
                 "receives), and send the chunk's numbers: the check reads them")),
    Exercise(2, "03-tensor-parallel.md", "TP", "the column-parallel layer's backward",
             "column_parallel_backward", check_tp.check_column_backward, check_tp.column_parallel_backward, hints=(
                 "y_i = x W_i + b_i only involves this rank's columns: dW_i and db_i need only x and dy_i",
                 "dW_i = x^T dy_i over all leading dimensions (flatten x to (N, in), dy_i to (N, out_i))",
                 "dL/dx = dy W^T = sum_i dy_i W_i^T: this rank's share is dy_i W_i^T, the all-reduce adds the rest")),
    Exercise(3, "03-tensor-parallel.md", "TP", "the row-parallel layer's forward",
             "row_parallel_forward", check_tp.check_row_forward, check_tp.row_parallel_forward, hints=(
                 "x W = sum_i x_i W_i: each rank computes a partial product of the whole output's shape",
                 "the all-reduce is the sum of the partial products over ranks",
                 "b is replicated: add it after the sum, once")),
    Exercise(4, "03-tensor-parallel.md", "TP", "predict: MiB of activation all-reduces per rank and step, tp 2",
             "ANSWER", check_tp.check_allreduce_mib, check_tp.activation_allreduce_mib, hints=(
                 "one activation, b x s x h = 32 x 64 x 64 float64 numbers, is exactly 1 MiB",
                 "each block has two column-then-row pairs (attention, MLP): one all-reduce forward (g) and one "
                 "backward (f) each",
                 "the vocabulary-parallel embedding adds one forward all-reduce and the LM head one backward"),
             after="Measure it: .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --tp 2 --dtype float64 --steps 5 "
                   "--no-progress; its 'tp ... MB' counts the bytes of both ranks together"),
    Exercise(5, "04-pipeline.md", "PP", "predict: busy and total device time units of a 4-stage pipeline",
             "ANSWER", check_pp.check_busy_of_total, check_pp.busy_of_total, hints=(
                 "busy: every device runs one forward per micro-batch, one unit each",
                 "the last micro-batch enters stage 0 at time m - 1 and needs p more units to leave stage p - 1",
                 "total device time counts every device for the whole makespan, idle or not"),
             after="Measure it: .venv/bin/hpcpar schedule --stages 4 --microbatches 4 --forward-only"),
    Exercise(6, "04-pipeline.md", "PP", "the 1F1B order of one stage",
             "one_f_one_b", check_pp.check_one_f_one_b, check_pp.one_f_one_b, hints=(
                 "stage s's first backward needs micro-batch 0 to go through the p - 1 - s later stages and back",
                 "so stage s runs min(p - s - 1, m) forwards first (the warm-up)",
                 "then one forward, one backward, while forwards remain; then the remaining backwards, in order"),
             after="Compare with .venv/bin/hpcpar schedule --stages 4 --microbatches 8 --table"),
    Exercise(7, "05-data-parallel.md", "DP", "the slice of a padded bucket ZeRO-1 gives each rank",
             "zero1_shard", check_dp.check_zero1_shard, check_dp.zero1_shard, hints=(
                 "the bucket is padded with zeros to the next multiple of dp: ceil(numel / dp) dp numbers",
                 "every rank gets the same length k = ceil(numel / dp), so that the all-gather is one call",
                 "rank r takes [r k, (r + 1) k): the last slices may hold padding only")),
    Exercise(8, "06-3d.md", "3D", "a rank's (tp, pp, dp) coordinates",
             "coords", check_3d.check_coords, check_3d.coords, hints=(
                 "tp is the fastest axis: tp_i = rank mod tp",
                 "then dp: the next tp x dp ranks hold one pipeline stage of every replica",
                 "rank = tp_i + tp (dp_i + dp pp_i)")),
    Exercise(9, "06-3d.md", "3D", "predict: pipeline hops that cross nodes, tp 2 x pp 4 x dp 2 on 2 nodes",
             "ANSWER", check_3d.check_crossing_hops, check_3d.crossing_hops, hints=(
                 "in the order tp-dp-pp, stage s of every replica is the tp x dp = 4 ranks 4s .. 4s + 3",
                 "node 0 holds ranks 0-7: which stages is that?",
                 "each of the tp x dp = 4 pipelines crosses once, between two of its stages"),
             after="Measure it: .venv/bin/hpcpar grid --tp 2 --pp 4 --dp 2 --world 16 --ranks-per-node 8"),
    Exercise(10, "07-checkpoints.md", "checkpoints", "resharding a tensor to another tp, fused Q|K|V included",
             "reshard", check_state.check_reshard, check_state.reshard, hints=(
                 "assemble the full tensor first (np.concatenate along dim), then cut it again (np.split)",
                 "with groups > 1 each piece holds its part of every group side by side: [q_i | k_i | v_i]",
                 "so split every piece into groups blocks, put each group back together on its own, and cut each "
                 "group into new_parts before concatenating a new piece's blocks")),
    Exercise(11, "08-tracing.md", "tracing", "the bubble of a traced step",
             "bubble", check_state.check_bubble, check_state.bubble, hints=(
                 "busy: the sum of every interval's length, over all ranks",
                 "the makespan runs from the earliest start of any rank to the latest end of any rank",
                 "bubble = 1 - busy / (p x makespan)")),
    Exercise(12, "08-tracing.md", "tracing", "the share of communication hidden behind compute",
             "hidden_share", check_state.check_hidden_share, check_state.hidden_share, hints=(
                 "merge the communication intervals first: two overlapping transfers are one busy link",
                 "for each merged interval, the length covered by the union of the compute intervals",
                 "divide by the length of the merged communication")),
    Exercise(13, "02-collectives.md", "DP", "a ring all-reduce on 4 MPI ranks, with non-blocking sends",
             "ring_allreduce", check_dp.check_ring_allreduce_mpi, check_dp.ring_allreduce_mpi, ranks=4, hints=(
                 "the ring of exercise 1, one rank's part of it: rank r sends to (r + 1) % p, receives from (r - 1) % p",
                 "at each step post the receive and the send, then wait for both: "
                 "wait_all([comm.irecv_(buf, left), comm.isend(chunk, right)])",
                 "a blocking comm.send on every rank at once waits for a receive nobody has posted yet")),
    Exercise(14, "04-pipeline.md", "PP", "a 2-stage pipeline whose blocking sends deadlock: reorder them",
             "PROGRAM", check_pp.check_program_mpi, check_pp.unblocked_program(), ranks=2,
             precheck=check_pp.precheck_program, hints=(
                 "a blocking send of 8 MB returns only once the other rank has reached the matching receive",
                 "in the steady state rank 0 sends an activation while rank 1 sends a gradient: both wait",
                 "let one of the two receive first: on rank 1, swap each send with the receive right after it")),
    Exercise(15, "03-tensor-parallel.md", "TP", "a tensor-parallel MLP on 2 MPI ranks: place its all-reduces",
             "tp_mlp", check_tp.check_tp_mlp, check_tp.tp_mlp, ranks=2, hints=(
                 "after the row-parallel product each rank holds a partial sum of y",
                 "comm.all_reduce(partial) adds them; add b2 after it, once",
                 "in backward the column-parallel layer gives each rank a share of dx: all-reduce it too")),
    Exercise(16, "09-context-parallel.md", "CP", "merge two online-softmax partial results",
             "merge", check_cp.check_merge, merge, hints=(
                 "O_b is a softmax-weighted mean over block b's keys and exp(lse_b) its normaliser",
                 "lse = log(exp(lse1) + exp(lse2)), computed without overflow: np.logaddexp",
                 "O = exp(lse1 - lse) O1 + exp(lse2 - lse) O2; where lse is -inf (no key seen) use 0 instead "
                 "of lse in the exponents")),
    Exercise(17, "09-context-parallel.md", "CP", "the key/value positions rank r holds at ring step s",
             "kv_positions", check_cp.check_kv_positions, check_cp.kv_positions, hints=(
                 "at step s the block that arrives came from s ranks to the left: rank (r - s) mod cp",
                 "rank j's own tokens: the sequence cut into 2 cp chunks, chunks j and 2 cp - 1 - j",
                 "list the positions in increasing order")),
    Exercise(18, "10-llama.md", "Llama", "the backward of the rotary embedding",
             "rope_backward", check_llama.check_rope_backward, rope_backward, hints=(
                 "y = x cos + R(x) sin, with R = rotate_half a fixed linear map",
                 "dx = dy cos + R^T (dy sin)",
                 "R turns each feature pair by +90 degrees, so R^T = -R")),
    Exercise(19, "10-llama.md", "Llama", "the key/value head of each query head on a tensor-parallel rank",
             "kv_heads", check_llama.check_kv_heads, check_llama.kv_heads, hints=(
                 "tp cuts the query heads and the K/V heads into tp consecutive runs each",
                 "globally, query head g uses K/V head g // (n_head / n_kv_head)",
                 "rank r holds query heads r n_head/tp .. (r + 1) n_head/tp - 1")),
    Exercise(20, "11-mixed-precision.md", "precision", "dynamic loss scaling: skip and halve, grow after N clean steps",
             "next_scale", check_precision.check_next_scale, check_precision.next_scale, hints=(
                 "an overflow (inf or nan in the scaled gradients): the update is skipped",
                 "after an overflow the scale halves and the count of clean steps starts again from 0",
                 "after growth_interval clean steps in a row the scale doubles and the count restarts")),
    Exercise(21, "12-hangs.md", "hangs", "from flight records: the culprit, and what each rank waits for",
             "hang_diagnosis", check_hangs.check_hang_diagnosis, check_hangs.hang_diagnosis, hints=(
                 "a rank blocks in an operation that has not ended and that it waits on (wait is not None)",
                 "of several, the oldest (smallest id): it is the one the rank cannot get past",
                 "culprits: ranks with no record or a dead one; if every rank answered, the live ones not blocked")),
    Exercise(22, "13-recomputation.md", "memory", "predict: what recomputation keeps and what it runs again",
             "ANSWER", check_memory.check_recompute, check_memory.recompute_answer, hints=(
                 "full recomputation keeps only the block's input, (B, T, C)",
                 "selective drops the attention probabilities, (B, NH, T, T), and the scaled queries beside them",
                 "a block that recomputes runs its forward again in backward: attention with it"),
             after="Measure it: .venv/bin/hpcpar bench --only recompute --quick compares the modes on a whole model"),
    Exercise(23, "15-zero.md", "DP", "ZeRO-3: gather a unit before its forward, free it after",
             "zero3_forward", check_zero.check_zero3_forward, check_zero.zero3_forward, hints=(
                 "the flat buffer holds p k numbers, k = len(shard); this rank's slice goes to [r k, (r + 1) k) "
                 "before the gather is posted: the all-gather fills the other slices in place",
                 "post unit 0's gather first; in the loop wait for unit i's, post unit i + 1's, then set "
                 "param.data = full[a:b].reshape(param.data.shape) and run the layer",
                 "after the layer: param.data = None for each of its parameters, and drop your own reference "
                 "to the buffer (keep the requests and buffers in flight in a dict you pop from)")),
    Exercise(24, "16-v-pipelines.md", "PP", "ZB-V's order for one rank",
             "zb_v", check_v.check_zb_v, check_v.zb_v, hints=(
                 "micro-batch 0 comes back to rank r's chunk 1 after 2(p - r) - 1 chunk forwards: run that many "
                 "chunk-0 forwards first",
                 "then r pairs F.1, F as the first chunk-1 forwards arrive, then p - r times F.1 B.1 W.1",
                 "steady: F, B, W of chunk 0 then F.1, B.1, W.1; in the drain keep the Ws back until the Bs are "
                 "done (rank r: r pairs B, B.1, then p - r times B W)"),
             after="Compare with .venv/bin/hpcpar schedule --stages 4 --microbatches 8 --schedule zb-v --table"),
    Exercise(25, "17-all-to-all.md", "MoE", "the MoE dispatch and combine: permutation, send counts, combine",
             "dispatch_combine", check_a2a.check_dispatch_combine, check_a2a.dispatch_combine, hints=(
                 "assignment a = t k + j is token t's j-th choice; a stable sort of idx.reshape(-1) groups them "
                 "by expert, in token order within each (np.argsort(..., kind='stable'))",
                 "rank q holds experts q E/ep .. (q+1) E/ep - 1: its rows are the sum of those experts' counts",
                 "row i of ye is assignment order[i]: token order[i] // k, weight w.reshape(-1)[order[i]]")),
    Exercise(26, "17-all-to-all.md", "CP", "the Ulysses transpose: sequence cut to head cut",
             "seq_to_heads", check_a2a.check_seq_to_heads, check_a2a.seq_to_heads, hints=(
                 "rank j's heads are one contiguous run: j H/p .. (j+1) H/p - 1, from every rank's part",
                 "rank i's token t goes to position positions[i][t] of the whole sequence, not to i T/p + t",
                 "with np.empty((B, H/p, T, HS)), out[:, :, positions[i]] = parts[i][:, heads of j] for every i")),
    Exercise(27, "10-llama.md", "Llama", "the input gradient of QK-norm",
             "qk_norm_dx", check_llama.check_qk_norm_dx, check_llama.qk_norm_dx, hints=(
                 "each (b, head, t) row of HS features is normalised on its own: rstd = 1 / sqrt(mean(x^2) + eps), "
                 "the mean over the last axis (keepdims=True), xhat = x rstd; g (HS,) broadcasts over the heads",
                 "rstd depends on x: d rstd / d x_j = -rstd^3 x_j / HS, so dx is not just rstd g dy - the "
                 "Jacobian of a row is rstd I less a rank-one term along xhat",
                 "with dxhat = dy g: dx = rstd (dxhat - xhat mean(dxhat xhat)), the mean per row, over the last "
                 "axis")),
    Exercise(28, "17-all-to-all.md", "MoE", "predict: bytes a rank hands the expert-parallel all-to-alls, ep 2 and 4",
             "ANSWER", check_a2a.check_ep_rows_bytes, check_a2a.ep_rows_bytes, hints=(
                 "batch 16 over dp 4: a rank routes 4 sequences of 64 tokens, each token to top_k = 2 experts - "
                 "one row of d_model float64 numbers per choice",
                 "a rank hands MPI every one of its rows, the ones for its own experts included: the rows to "
                 "the other ranks are (ep - 1) / ep of them, but the bytes handed do not depend on ep, nor on "
                 "how evenly the router spreads them",
                 "each MoE layer runs four all-to-alls of those rows a step: dispatch and combine forward, the "
                 "gradients the same two ways backward"),
             after="Measure it: .venv/bin/mpiexec -n 4 .venv/bin/hpcpar train --model mixtral-tiny --dp 4 --ep 2 "
                   "--dtype float64 --steps 3 --batch-size 16 --no-progress --summary-json ep2.json, then --ep 4; "
                   "bytes_per_step's 'ep' (the summary's 'ep ... MB') counts the four ranks together, with the "
                   "experts' counts (8 E bytes a layer and rank)"),
    Exercise(29, "01-one-rank.md", "attention", "attention in causal query blocks",
             "causal_blocks_forward", check_attention.check_causal_blocks_forward,
             check_attention.causal_blocks_forward, hints=(
                 "query i sees keys 0 .. i, so the rows [a, z) of a block together see keys [0, z): slice k and "
                 "v to their first z positions (z = min(a + block, T))",
                 "a block's S is (B, NH, z - a, z) = Q[a:z] K[:z]^T / sqrt(HS); only its last z - a columns, the "
                 "block's diagonal square, need the mask: -inf where key j is after query a + i",
                 "softmax over the last axis (subtract each row's maximum first), then o[:, :, a:z] = P V[:z]; "
                 "append each block's P to the list")),
]
BY_NUMBER = {e.number: e for e in EXERCISES}
