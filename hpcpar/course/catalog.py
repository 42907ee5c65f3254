"""The exercises (docs/course/): what each asks, its check, its reference, the modules that hold its
answer (hidden from the student's file) and its hints.  Numbered in the order they joined the course;
lessons.py says which lesson holds which.  How to add one: the package docstring (__init__.py)."""
from hpcpar.course import (check_3d, check_a2a, check_attention, check_cp, check_dp, check_fp8, check_hangs,
                           check_llama, check_measure, check_memory, check_muon, check_pp, check_precision, check_state,
                           check_tp, check_v, check_zero)
from hpcpar.course import check_deepseek, check_documents, check_recovery
from hpcpar.course.collectives import ring_allreduce
from hpcpar.course.exercise import Exercise as E
from hpcpar.ops.ring_attention import merge
from hpcpar.ops.rope import rope_backward

TP, PP, CP = ("hpcpar.tensor_parallel",), ("hpcpar.pipeline",), ("hpcpar.context_parallel", "hpcpar.ops.ring_attention")

EXERCISES = [
    E(1, "02-collectives.md", "DP", "a ring all-reduce: reduce-scatter, then all-gather", "ring_allreduce",
      check_dp.check_ring_allreduce, ring_allreduce, hints=(
          "a rank never sends more than one chunk of n/p numbers at a time, and only to its right neighbour; "
          "after p - 1 steps every chunk's sum must sit complete on some rank",
          "first half: at step s each rank passes on the chunk it has been adding into, and the receiver adds "
          "its own copy of that chunk to it; which chunk is that for rank r at step s?",
          "second half: the completed chunks travel the same ring and overwrite, so that after p - 1 more "
          "steps every rank holds every sum",
          "method: chunk (r - s) mod p leaves rank r at reduce-scatter step s, chunk (r + 1 - s) mod p at "
          "all-gather step s; take all of a step's messages before any rank changes its chunks")),
    E(2, "03-tensor-parallel.md", "TP", "the column-parallel layer's backward", "column_parallel_backward",
      check_tp.check_column_backward, check_tp.column_parallel_backward, hidden=TP, hints=(
          "which of the three gradients involves only this rank's columns of W and of dL/dy?",
          "dL/dx sums over every output column: this rank can add only its own columns' terms",
          "method: dW_i is x transposed times dy_i (the leading axes flattened into one), db_i the column "
          "sums of dy_i, and the rank's share of dL/dx is dy_i times W_i transposed")),
    E(3, "03-tensor-parallel.md", "TP", "the row-parallel layer's forward", "row_parallel_forward",
      check_tp.check_row_forward, check_tp.row_parallel_forward, hidden=TP, hints=(
          "a product of a row block of W with the matching columns of x is a partial sum of the whole y",
          "the all-reduce adds the partial sums; the bias is not part of any of them",
          "method: sum the ranks' x_i W_i, add b once, and give every rank that same y")),
    E(4, "03-tensor-parallel.md", "TP", "predict: MiB of activation all-reduces per rank and step, tp 2", "ANSWER",
      check_tp.check_allreduce_mib, check_tp.activation_allreduce_mib, hints=(
          "count the activations that cross a rank boundary, not the layers: one b x s x h activation is "
          "32 x 64 x 64 float64 numbers",
          "each column-then-row pair costs one all-reduce forward (g) and one backward (f); how many pairs "
          "does a GPT-2 block have?",
          "method: 2 pairs a block x 2 directions x layers, plus the vocabulary-parallel embedding's forward "
          "and the head's backward, times the MiB of one activation"),
      after="Measure it: .venv/bin/mpiexec -n 2 .venv/bin/hpcpar train --tp 2 --dtype float64 --steps 5 "
            "--no-progress; its 'tp ... MB' counts the bytes of both ranks together"),
    E(5, "04-pipeline.md", "PP", "predict: busy and total device time units of a 4-stage pipeline", "ANSWER",
      check_pp.check_busy_of_total, check_pp.busy_of_total, hints=(
          "busy time does not depend on the order: every device runs each micro-batch's forward once",
          "the total is the number of devices times the time from the first forward to the last",
          "method: the last micro-batch starts on stage 0 at time m - 1 and needs p units to leave the last "
          "stage"),
      after="Measure it: .venv/bin/hpcpar schedule --stages 4 --microbatches 4 --forward-only"),
    E(6, "04-pipeline.md", "PP", "the 1F1B order of one stage, run by the trainer on 2 and 4 ranks",
      "one_f_one_b", check_pp.check_one_f_one_b, check_pp.one_f_one_b, ranks=4, plug=True,
      mpi_check=check_pp.check_one_f_one_b_in_trainer, hidden=PP, hints=(
          "the last stage can run a backward as soon as a forward is done; an earlier stage must wait for "
          "the micro-batch's round trip through the stages after it",
          "fill that wait with forwards, then alternate; at the end only backwards are left",
          "method: stage s runs min(p - 1 - s, m) warm-up forwards, then (forward, backward) pairs while "
          "forwards remain, then the remaining backwards in micro-batch order"),
      after="Compare with .venv/bin/hpcpar schedule --stages 4 --microbatches 8 --table"),
    E(7, "05-data-parallel.md", "DP", "ZeRO-1's slice of a padded bucket, run by the trainer at dp 2, 3, 4",
      "zero1_shard", check_dp.check_zero1_shard, check_dp.zero1_shard, ranks=4, plug=True,
      mpi_check=check_dp.check_zero1_in_trainer, hidden=("hpcpar.data_parallel",), hints=(
          "one all-gather call puts the slices back together: so every slice has the same length",
          "the padding at the end makes the bucket a multiple of dp; a slice may hold padding only",
          "method: the length is numel divided by dp, rounded up; rank r's slice starts r lengths in")),
    E(8, "06-3d.md", "3D", "a rank's (tp, pp, dp) coordinates", "coords", check_3d.check_coords, check_3d.coords,
      hidden=("hpcpar.comm.grid", "hpcpar.comm.placement"), hints=(
          "the fastest axis changes from one rank to the next; the slowest only every tp x dp ranks",
          "write the rank as a number with mixed digits: tp first, then dp, then pp",
          "method: rank = tp_i + tp (dp_i + dp pp_i); read the digits off with remainders and integer division")),
    E(9, "06-3d.md", "3D", "predict: pipeline hops that cross nodes, tp 2 x pp 4 x dp 2 on 2 nodes", "ANSWER",
      check_3d.check_crossing_hops, check_3d.crossing_hops, hints=(
          "in the order tp-dp-pp a stage of every replica is one run of consecutive ranks",
          "which stages does node 0 hold? then a pipeline leaves node 0 at one hop only",
          "method: count the pipelines (tp x dp of them), each crossing once"),
      after="Measure it: .venv/bin/hpcpar grid --tp 2 --pp 4 --dp 2 --world 16 --ranks-per-node 8"),
    E(10, "07-checkpoints.md", "checkpoints", "resharding a tensor to another tp, fused Q|K|V included",
      "reshard", check_state.check_reshard, check_state.reshard,
      hidden=("hpcpar.nn.parameter", "hpcpar.checkpoint"), hints=(
          "whatever the old cut, the full tensor is the same: put it back together first",
          "with groups, each piece holds its own part of every group side by side along dim",
          "method: cut every piece into its groups along dim, join each group's parts, cut each group into "
          "the new number of parts, and make new piece i from part i of every group - along dim, which need "
          "not be the last axis")),
    E(11, "08-tracing.md", "tracing", "the bubble of a traced step", "bubble", check_state.check_bubble,
      check_state.bubble, hidden=("hpcpar.pipeline.bubble", "hpcpar.tools.trace"), hints=(
          "idle time is the device time nobody computed, over the whole pipeline",
          "the step does not start at 0, and every rank is counted from the pipeline's first start to its "
          "last end",
          "method: 1 minus the sum of all intervals' lengths over p times (latest end minus earliest start)")),
    E(12, "08-tracing.md", "tracing", "the share of communication hidden behind compute", "hidden_share",
      check_state.check_hidden_share, check_state.hidden_share, hidden=("hpcpar.tools.trace",), hints=(
          "a moment counts once, however many transfers or computations cover it",
          "turn each kind into a union of disjoint intervals first",
          "method: merge the sorted intervals of each kind, add up the overlaps of every merged communication "
          "interval with the merged compute ones, and divide by the merged communication's length")),
    E(13, "02-collectives.md", "DP", "a ring all-reduce on 4, 3 and 2 MPI ranks, with non-blocking sends",
      "ring_allreduce", None, check_dp.ring_allreduce_mpi, ranks=4, mpi_check=check_dp.check_ring_allreduce_mpi,
      hints=(
          "this is exercise 1 seen from one rank: which chunk leaves, which arrives, at each step?",
          "a blocking send to a neighbour who is itself sending waits forever once messages are large",
          "method: each step posts the receive from rank - 1 and the send to rank + 1, then waits for both "
          "before touching the chunks; p is the communicator's size, never a number")),
    E(14, "04-pipeline.md", "PP", "a 2-stage pipeline whose blocking sends deadlock: reorder them", "PROGRAM",
      check_pp.precheck_program, check_pp.unblocked_program(), ranks=2, mpi_check=check_pp.check_program_mpi,
      hints=(
          "a large blocking send returns only when the partner has reached the matching receive",
          "in the steady state both ranks send at once, one an activation, the other a gradient",
          "method: let one rank receive first wherever the two exchange: on rank 1, swap each send with the "
          "receive right after it")),
    E(15, "03-tensor-parallel.md", "TP", "a tensor-parallel MLP on 2, 3 and 4 MPI ranks: place its all-reduces",
      "tp_mlp", None, check_tp.tp_mlp, ranks=4, mpi_check=check_tp.check_tp_mlp, hidden=TP, hints=(
          "after a row-parallel product every rank holds a partial sum; after a column-parallel one, a slice",
          "a replicated bias must enter the sum once, whatever the number of ranks",
          "method: all-reduce the row product before adding b2, and the column layer's input gradient in the "
          "backward; nowhere else")),
    E(16, "09-context-parallel.md", "CP", "merge two online-softmax partial results", "merge",
      check_cp.check_merge, merge, hidden=CP, hints=(
          "each partial O is a weighted mean over its block, and exp(lse) is that block's total weight",
          "the merged lse is the log of the two totals added; compute it without forming exp(800)",
          "method: logaddexp for lse, then weight each O by exp(its lse minus the merged lse); a row that "
          "saw no key in either block has lse -inf: use 0 in place of the merged lse in the exponents")),
    E(17, "09-context-parallel.md", "CP", "the key/value positions rank r holds at ring step s", "kv_positions",
      check_cp.check_kv_positions, check_cp.kv_positions, hidden=CP, hints=(
          "blocks move one rank to the right per step: whose block has come s ranks?",
          "a rank's own tokens are two chunks of the 2 cp chunks, one early and one late",
          "method: the block of rank (r - s) mod cp, i.e. chunks j and 2 cp - 1 - j of seq_len / (2 cp) "
          "positions each, in increasing order")),
    E(18, "10-llama.md", "Llama", "the backward of the rotary embedding", "rope_backward",
      check_llama.check_rope_backward, rope_backward, hidden=("hpcpar.ops.rope",), hints=(
          "the rotation is linear in x with constant tables: its backward is its transpose applied to dy",
          "the cos term is a diagonal scaling (its own transpose); rotate_half is a fixed 90-degree turn",
          "method: dx = dy cos + R^T (dy sin), and the transpose of a +90-degree turn is a -90-degree turn")),
    E(19, "10-llama.md", "Llama", "the key/value head of each query head on a tensor-parallel rank", "kv_heads",
      check_llama.check_kv_heads, check_llama.kv_heads,
      hidden=("hpcpar.ops.gqa", "hpcpar.nn.parameter") + TP, hints=(
          "a query head attends with the K/V head of its group, globally; tp only changes which heads a rank "
          "holds",
          "tp cuts the query heads and the K/V heads each into tp consecutive runs",
          "method: rank r holds query heads r n_head/tp onward; the group of global head g is g divided by "
          "n_head / n_kv_head, rounded down")),
    E(20, "11-mixed-precision.md", "precision", "dynamic loss scaling: skip and halve, grow after N clean steps",
      "next_scale", check_precision.check_next_scale, check_precision.next_scale,
      hidden=("hpcpar.precision",), hints=(
          "an overflowed step's gradients are garbage: it must not change the weights",
          "the scale is a float that may fall below 1: halving must keep it a positive power of two",
          "method: on an overflow skip the update, halve the scale (a true division), restart the count; on a "
          "clean step count it, and double the scale and restart the count when it reaches the interval")),
    E(21, "12-hangs.md", "hangs", "from flight records: the culprit, and what each rank waits for",
      "hang_diagnosis", check_hangs.check_hang_diagnosis, check_hangs.hang_diagnosis, hidden=("hpcpar.watch",),
      hints=(
          "a rank that is missing or dead holds the others up; a posted send nobody waited for blocks nobody",
          "a rank is stuck in the oldest operation it waits on that has not ended",
          "method: culprits are the silent or dead ranks, or else the live ranks blocked in nothing; each "
          "other live rank waits in its oldest unfinished, waited-for operation")),
    E(22, "13-recomputation.md", "memory", "predict: what recomputation keeps and what it runs again", "ANSWER",
      check_memory.check_recompute, check_memory.recompute_answer, hints=(
          "to run a forward again you need its input and nothing else",
          "the attention probabilities grow with T squared per head; selective drops them (and what sits "
          "beside them) and keeps q, k, v",
          "method: count the numbers of each array a mode keeps (B T C for a block input, B NH T T for the "
          "probabilities ...), and count one attention forward per recomputation"),
      after="Measure it: .venv/bin/hpcpar bench --only recompute --quick compares the modes on a whole model"),
    E(23, "14-zero.md", "DP", "ZeRO-3: gather a unit before its forward, free it after", "zero3_forward",
      check_zero.check_zero3_forward, check_zero.zero3_forward,
      hidden=("hpcpar.data_parallel", "hpcpar.nn.stage"), hints=(
          "the gather must travel while the previous unit computes, and arrive before its own unit does",
          "a view of a buffer keeps the buffer alive; so does a variable; the buffer's dtype is the shard's",
          "method: post unit 0's gather; for each unit wait for its gather, post the next one, point the "
          "parameters at their ranges, run the layer, then drop the views and the buffer")),
    E(24, "15-v-pipelines.md", "PP", "ZB-V's order for one rank", "zb_v", check_v.check_zb_v, check_v.zb_v,
      hidden=PP, hints=(
          "micro-batch 0 comes back to a rank's second chunk only after the chunk-0 forwards of the ranks "
          "below it and the turn of the V: fill that wait with forwards",
          "a weight gradient W can wait, but until it runs its micro-batch's activations stay: postpone only "
          "as much as the drain needs",
          "method: warm up with 2(p - r) - 1 chunk-0 forwards, interleave chunk-1 forwards, run the steady "
          "state as forward-backward-W of each chunk, and in the drain run backwards first, the Ws in the gaps"),
      after="Compare with .venv/bin/hpcpar schedule --stages 4 --microbatches 8 --schedule zb-v --table"),
    E(25, "16-all-to-all.md", "MoE", "the MoE dispatch and combine: permutation, send counts, combine",
      "dispatch_combine", check_a2a.check_dispatch_combine, check_a2a.dispatch_combine,
      hidden=("hpcpar.ops.moe", "hpcpar.expert_parallel", "hpcpar.nn.moe"), hints=(
          "a rank's rows for one expert must be contiguous, and within an expert in token order",
          "a rank holds consecutive experts: its rows are the sum of its experts' counts",
          "method: a stable sort of the flattened choices gives the order; assignment a belongs to token a / k "
          "(rounded down), with the a-th of the flattened weights; the combine adds weight times row into its token")),
    E(26, "16-all-to-all.md", "CP", "the Ulysses transpose: sequence cut to head cut", "seq_to_heads",
      check_a2a.check_seq_to_heads, check_a2a.seq_to_heads, hidden=("hpcpar.context_parallel",), hints=(
          "after the transpose rank j holds a run of heads, for every token of the sequence",
          "a rank's tokens are not a contiguous run of positions under the causal balance",
          "method: for every destination j and source i, put source i's heads of j at source i's positions "
          "of the sequence axis")),
    E(27, "10-llama.md", "Llama", "the input gradient of QK-norm", "qk_norm_dx", check_llama.check_qk_norm_dx,
      check_llama.qk_norm_dx, hidden=("hpcpar.ops.qk_norm", "hpcpar.nn.qk_norm", "hpcpar.ops.rmsnorm"), hints=(
          "rstd depends on the whole row: moving one feature changes every output of its row",
          "the gain multiplies dy before anything else; then the row's Jacobian is rstd times (I minus a "
          "rank-one projection along xhat)",
          "method: with dxhat = dy g, dx = rstd (dxhat - xhat mean(dxhat xhat)), the mean per row over the "
          "features")),
    E(28, "16-all-to-all.md", "MoE", "predict: bytes a rank hands the expert-parallel all-to-alls, ep 2 and 4",
      "ANSWER", check_a2a.check_ep_rows_bytes, check_a2a.ep_rows_bytes, hints=(
          "a rank hands MPI every one of its rows, the ones for its own experts included",
          "one row per (token, choice), d_model float64 numbers, whatever the router's balance or ep",
          "method: tokens per rank x top_k rows x bytes a row, times four all-to-alls a MoE layer "
          "(dispatch, combine, both ways) and the layers"),
      after="Measure it: .venv/bin/mpiexec -n 4 .venv/bin/hpcpar train --model mixtral-tiny --dp 4 --ep 2 "
            "--dtype float64 --steps 3 --batch-size 16 --no-progress --summary-json ep2.json, then --ep 4; "
            "bytes_per_step's 'ep' (the summary's 'ep ... MB') counts the four ranks together, with the "
            "experts' counts (8 E bytes a layer and rank)"),
    E(29, "01-one-rank.md", "attention", "attention in causal query blocks", "causal_blocks_forward",
      check_attention.check_causal_blocks_forward, check_attention.causal_blocks_forward,
      hidden=("hpcpar.ops.attention", "hpcpar.nn.attention_core"), hints=(
          "a block of queries sees no key after its last query",
          "only the block's own diagonal square needs a mask, and it sits at the block's offset",
          "method: for block [a, z) take the first z keys and values, scale the scores by 1 / sqrt(HS), put "
          "-inf where the key index exceeds a plus the row index, softmax each row, multiply by the values")),
    E(30, "03-tensor-parallel.md", "TP", "your column/row-parallel pair in the trainer, tp 2 and 4",
      "column_forward", None, None, ranks=4, plug=True,
      mpi_check=check_tp.check_tp_pair, hidden=TP, hints=(
          "f and g are the only places where ranks talk; the GEMMs in between are one rank's",
          "f is free forward and sums backward; g sums forward and is free backward",
          "method: column forward x W_i + b_i; column backward all-reduces dy_i W_i^T; row forward all-reduces "
          "x_i W_i and adds b once; weight gradients are each rank's own")),
    E(31, "09-context-parallel.md", "CP", "ring attention's forward in the trainer, cp 2 and 4",
      "ring_attention_forward", None, None, ranks=4, plug=True, mpi_check=check_cp.check_ring_forward,
      hidden=CP, hints=(
          "exercise 17 said which block a rank holds at each step; exercise 16 how to merge its result",
          "the next block can travel while this one computes: post the exchange before attending",
          "method: p steps; at each post the receive from rank - 1 and the send to rank + 1 (but not at the "
          "last step), attend to the block at hand with its owner's positions, merge, then wait")),
    E(32, "16-all-to-all.md", "MoE", "the experts' all-to-alls in the trainer, ep 2 and 4", "expert_dispatch",
      None, None, ranks=4, plug=True, mpi_check=check_a2a.check_expert_dispatch,
      hidden=("hpcpar.expert_parallel",), hints=(
          "a rank does not know how many rows it will receive until the others tell it",
          "rows arrive grouped by source rank; the experts want them grouped by expert",
          "method: exchange the counts, send the rows with the counts per rank, reorder expert by expert, and "
          "in the combine undo the reorder and send each row back the way it came")),
    E(33, "08-tracing.md", "measuring", "measure pp 2 against dp 2, predict and explain the faster", "ANSWER",
      check_measure.check_measurement, check_measure.measured_answer, hints=(
          "run each layout with --summary-json and --profile, a few steps, and read the median step",
          "what does the pipeline do that data parallelism does not? the simulator puts a number on it",
          "method: ms per step from each summary, pp 2's measured and simulated bubble from its summary, the "
          "faster layout, and the cause among the choices the template lists"),
      after="Read where pp 2's time went: its profile's 'comm pp' line is mostly the bubble - time a stage "
            "waits in a receive for its neighbour"),
    E(34, "11-mixed-precision.md", "precision", "quantise a 1 x 128 tile to FP8 (E4M3) with its scale",
      "quantise_tile", check_fp8.check_quantise_tile, check_fp8.quantise_tile, hidden=("hpcpar.fp8",), hints=(
          "the scale sends the tile's largest magnitude to the format's largest number; everything else "
          "follows it",
          "E4M3 keeps 3 bits after the leading one: between 2^e and 2^(e+1) its numbers are 2^(e-3) apart, and "
          "below 2^-6 they stay 2^-9 apart (the subnormals)",
          "method: s = 448 / max(amax, 1e-12) as an fp32 number; multiply, round each product to the nearest "
          "multiple of its spacing (ties to even: numpy's rint does that), clip to 448, divide by s")),
    E(35, "11-mixed-precision.md", "precision", "pick the E8M0 scale of an MX 32-block", "e8m0_exponent",
      check_fp8.check_e8m0_exponent, check_fp8.e8m0_exponent, hidden=("hpcpar.fp8",), hints=(
          "only the block's largest magnitude matters: it is the one that must not pass 448",
          "a power of two that is too large wastes precision, one too small saturates: there is exactly one "
          "right k, and exact powers of two sit on the boundary",
          "method: k is the ceiling of log2(amax / 448), checked by multiplying back (a logarithm rounds), "
          "clamped to [-127, 127], and -127 for a block of zeros")),
    E(36, "11-mixed-precision.md", "precision", "which ranks' maxima make a sharded weight's amax", "amax_ranks",
      check_fp8.check_amax_ranks, check_fp8.amax_ranks,
      hidden=("hpcpar.fp8", "hpcpar.comm.grid", "hpcpar.training.low_precision"), hints=(
          "an amax covers some dimensions of W: which of them does tensor parallelism cut in each kind of layer?",
          "a per-column scale runs along K only: a column-parallel rank holds whole columns; a row-parallel "
          "one holds a part of every column",
          "method: the axes to combine are tp when the amax covers the cut dimension, plus dp and cp when "
          "ZeRO-3 quantises slices; the ranks are those that differ from this one only along those axes")),
    E(37, "09-context-parallel.md", "documents", "a packed window's positions, and the targets kept in the loss",
      "packed_window", check_documents.check_packed_window, check_documents.packed_window,
      hidden=("hpcpar.ops.masks",), hints=(
          "a document's first token has read nothing of its document before it: it sits where a fresh "
          "sequence begins",
          "each sequence of the batch is a window of its own; the end-of-text token is the last token of the "
          "document it ends; a target is the next token, whose id may be another document's",
          "method: walk each sequence - 0 at its start and wherever the id differs from the previous input's, "
          "else one more than the previous position; a target stays when its id equals its input's id, the "
          "window's last target included")),
    E(38, "09-context-parallel.md", "CP", "the key/value blocks ring attention skips for a window of documents",
      "ring_plan", check_documents.check_ring_plan, check_documents.ring_plan,
      hidden=CP + ("hpcpar.ops.masks",), hints=(
          "a query sees nothing of a block whose keys all lie after it or in other documents: the rule of one "
          "rank, applied by window position",
          "a rank's queries and the block's keys sit in the two chunks of the causal balance, wherever the ring "
          "has carried the block: compare ids at those window positions, not at indexes within a rank",
          "method: for rank r at step s take the block of rank (r - s) mod cp, test every query-key pair with "
          "the three conditions, and count the queries that see at least one key and the keys seen by at least "
          "one query")),
    E(39, "10-llama.md", "DeepSeek", "MLA's KV cache a token against grouped-query attention's", "kv_cache_bytes",
      check_deepseek.check_kv_cache_bytes, check_deepseek.kv_cache_bytes,
      hidden=("hpcpar.shape", "hpcpar.tools.plan", "hpcpar.nn", "hpcpar.ops.mla", "hpcpar.training.generate"), hints=(
          "the keys and values of every head are a function of what MLA keeps of a token: keep that, not them",
          "the latent makes the keys and the values alike; the rotary key is not made from it, and one serves "
          "every head",
          "method: per layer and token grouped-query attention keeps a key and a value of head_dim per K/V head, "
          "MLA its latent and its rotary key; every head's own would be a key of head_dim and a value of "
          "v_head_dim per query head; times the layers and the bytes of a number")),
    E(40, "15-v-pipelines.md", "PP", "where the MTP modules sit, and which gradients the pipeline's ends sum",
      "pipeline_ends", check_deepseek.check_pipeline_ends, check_deepseek.pipeline_ends,
      hidden=PP + ("hpcpar.nn", "hpcpar.training"), hints=(
          "the MTP modules read the model's last hidden state and share its head: they go where the loss is",
          "the last stage looks tokens up in the embedding only for the modules; the first stage owns it, so "
          "two ranks hold copies that must stay equal - unless they are one rank",
          "method: find the rank and chunk of the last virtual stage; sum only the embedding's gradient, over "
          "the first and last stage's ranks when they differ and MTP modules exist; the norm counts the first "
          "stage's copy alone")),
    E(41, "12-hangs.md", "reliability", "going on without a rank: the survivors' places and the transfers",
      "recovery_plan", check_recovery.check_recovery_plan, check_recovery.recovery_plan,
      hidden=("hpcpar.checkpoint", "hpcpar.training.restore", "hpcpar.training.recovery", "hpcpar.comm.grid"),
      hints=(
          "only what a survivor holds exists: a piece travels from one of them, and never to a rank that has it",
          "a rank of the new layout cuts its shard from whole tensors: it needs every part the old tp cut made, "
          "the optimizer's moments with them; the idle survivors hold pieces too",
          "method: renumber the survivors in order, place the first ones on the new grid, list what each holds "
          "(its old stage's keys, the part of its old tp index), then walk destinations, sorted keys and parts, "
          "taking each piece from the destination or the least-used holder")),
    E(42, "17-muon.md", "optimizers", "Newton-Schulz, Muon's orthogonalisation", "newton_schulz",
      check_muon.check_newton_schulz, check_muon.newton_schulz,
      hidden=("hpcpar.optim.newton_schulz", "hpcpar.optim.muon", "hpcpar.tensor_parallel.muon"), hints=(
          "the iteration acts on each singular value alone; it is only a polynomial if every one starts "
          "inside the interval where the polynomial pulls it towards 1",
          "the Frobenius norm is at least the largest singular value; a tall matrix's Gram X X^T would be "
          "the large one",
          "method: transpose a tall G, divide by its Frobenius norm floored at eps, then each step form A = "
          "X X^T, B = b A + c A A and X = a X + B X; transpose back")),
    E(43, "17-muon.md", "optimizers", "predict: the singular values of blockwise's update at tp 2 and 4",
      "ANSWER", check_muon.check_blockwise, check_muon.blockwise_singular_values, hints=(
          "an orthogonal block with more columns than rows has O_r O_r^T equal to the identity",
          "the Gram of blocks side by side is the sum of the blocks' Grams",
          "method: [O_0 | ... ] [O_0 | ... ]^T = sum over the tp blocks of I; the singular values are the square "
          "roots of that Gram's eigenvalues"),
      after="See it with Newton-Schulz's five steps instead of exact orthogonalisation: .venv/bin/mpiexec -n 2 "
            ".venv/bin/python -m hpcpar.examples.muon_tp (the last line: blockwise's halves put together)"),
    E(44, "17-muon.md", "optimizers", "which rank owns which matrix under ZeRO, and what each hands MPI",
      "ownership", check_muon.check_ownership, check_muon.ownership,
      hidden=("hpcpar.data_parallel", "hpcpar.optim.muon"), hints=(
          "a rank that took the longest matrix of one buffer has the most numbers when the next buffer starts",
          "the ranges of a buffer are equal, so the fullest rank sets everyone's, and the others pad",
          "method: keep one count per rank across the buffers; in each buffer, in decreasing size, give each "
          "matrix to the rank with the lowest count; a rank hands n times the fullest share plus the share "
          "itself, buffer by buffer")),
]
BY_NUMBER = {e.number: e for e in EXERCISES}
