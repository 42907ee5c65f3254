"""A job: what is being planned (model, machine, batch) and what the engine can do.

``Job.check(layout)`` says, in one line, why a layout cannot run (shapes that do not divide), or
returns None.  Whether it *fits* in memory is memory.py's question; how fast it runs, step.py's.
"""
from dataclasses import dataclass, field

from hpcpar.optim import state_arrays
from hpcpar.pipeline.schedules import KINDS, refusal
from hpcpar.tools.plan.flops import kv_heads_per_rank
from hpcpar.tools.plan.hardware import DTYPE_BYTES
from hpcpar.tools.plan.layout import SCHEDULES, pipeline_ends, stage_classes, stage_layers


def expert_check(model, layout):
    """Why the layout's expert parallelism cannot run (the engine's refusals, docs/moe.md), or None."""
    ep = layout.ep
    if model.experts and layout.tp > 1 and not layout.sp:
        return ("a mixture of experts with tp > 1 needs sequence parallelism here (without it every TP rank "
                "routes every token: tp times the expert work; Megatron-core requires it too)")
    if ep == 1:
        return None
    if not model.experts:
        return f"ep={ep} needs a model with experts"
    if ep < 1 or layout.replicas % ep:
        return f"ep={ep} does not divide dp*cp = {layout.replicas}"
    if model.experts % ep:
        return f"ep={ep} does not divide the {model.experts} experts"
    return None


@dataclass(frozen=True)
class Engine:
    """The engine features that change time or memory.  Defaults: hpcpar's own engine."""
    flash_attention: bool = False     # fused attention: no s*s score matrices in memory or HBM traffic
    causal_blocks: bool = False       # hpcpar on a host: the attention core computes and keeps only the
                                      # causal query blocks of the scores (ops/attention.causal_work)
    overlap_dp: bool = True           # DP all-reduce in buckets during the last backward (data_parallel/replicas.py)
    overlap_p2p: bool = True          # non-blocking sends, receives posted ahead; False: a stage waits
                                      # for each transfer (blocking send/recv pairs)
    scatter_gather_p2p: bool = False  # Megatron's p2p optimisation: each TP rank sends 1/t of the activation
    bucket_bytes: float = 25e6        # DP bucket size (PyTorch DDP's default, 25 MB)
    # mixed precision: bytes per parameter of (weights, gradients, optimizer state that ZeRO-1 shards).
    # None: hpcpar's (precision.py): a 16-bit compute copy, fp32 gradients, fp32 master weights and
    # adam_buffers fp32 arrays: 2 + 4 + 4 + 4 * 2 = 18 with Adam's m and v.
    # Megatron's own table (docs: distributed optimizer): fp16 params and grads 2 + 2 + 16 (fp32 main
    # params and grads, Adam m, v); bf16 params, fp32 grads 2 + 4 + 12.
    mixed_state_bytes: tuple = None
    adam_buffers: int = state_arrays("adamw")   # Adam m and v (hpcpar's update works in one scratch block)
    optimizer: str = "adamw"          # or "muon": Muon's one momentum for the blocks' matrices, AdamW for
                                      # the rest; Newton-Schulz's FLOPs and messages in the step (step.py)
    muon_tp: str = "duplicated"       # Muon's tensor-parallel mode (tensor_parallel/muon.py)
    ns_steps: int = 5                 # Newton-Schulz iterations
    ns_dtype: str = ""                # the dtype they run in ("": the master weights')
    shard_grad_buffer: bool = True    # ZeRO-1/2 reduce-scatter into a separate gradient shard (data_parallel/replicas.py)
    numpy_caches: bool = True         # hpcpar keeps the scaled Q and SwiGLU's sigmoid as well (memory.py)
    overlap_tp: bool = False          # TP collectives run under the GEMMs (Megatron's tp-comm-overlap,
                                      # PyTorch's async TP): only the part longer than the GEMMs shows
    fp8: bool = False                 # linear-layer GEMMs in fp8 (the attention core stays 16-bit)
    fp8_param_gather: bool = False    # ZeRO-3 gathers the quantised weights as FP8 codes, one byte a
                                      # number (zero_memory.gathered_number_bytes: memory.py, step.py)
    overlap_ep: bool = False          # EP all-to-alls run under another micro-batch's compute (DualPipe's
                                      # paired F and B chunks): only the part longer than that shows
    cp_allgather: bool = False        # context parallelism all-gathers K and V before the attention core,
                                      # exposed (Llama 3's), instead of a ring overlapped with it (compute.py)
    collective_buffer_bytes: float = 0.0   # fixed NCCL buffers per GPU (memory.py)
    gemm_workspace_bytes: float = 0.0      # fixed cuBLAS workspace per GPU
    fsdp_gather_once_with_pp: bool = False  # ZeRO-3 with pp > 1: a stage's weights gathered once per
                                      # step and kept, gradients accumulated unsharded (torchtitan)
    fsdp_reduce_once: bool = True     # ZeRO-3 with several micro-batches a step: a unit's gradient
                                      # accumulated unsharded, reduce-scattered after its last one (hpcpar's
                                      # fsdp.py); False: reduce-scattered after each (PyTorch's FSDP)
    allocator_cache: float = 0.0      # a caching allocator's reserve beyond what is allocated, as a share
                                      # of the per-micro-batch memory (memory.py)
    loss_bytes_per_logit: float = 4   # what the loss keeps per logit (memory.py); hpcpar: one fp32 array
    selective_ops: bool = False       # selective recomputation is PyTorch's op-level policy (memory.py)
    gemm_efficiency: float = 1.0      # the engine's kernels against the fused ones the hardware's
                                      # factor was fitted to (eager PyTorch: published.EAGER)
    gemm_efficiency_no_recompute: float | None = None  # the same for a layout that recomputes nothing,
                                      # where the engine sustains a different share (None: gemm_efficiency;
                                      # eager Composer: published.COMPOSER_EAGER)
    fp8_efficiency: float = 1.0       # the engine's fp8 GEMMs, scaling casts included, against the
                                      # fp8 peak x the hardware's factor (torchao Float8: published.FLOAT8)
    partition: str = "ends-light"     # how the engine cuts layers into stages (pipeline/partition.py):
                                      # the published engines' "ends-light" (the same as hpcpar's
                                      # "uniform" where the layers divide); an hpcpar train run's
                                      # "uniform" (local.train_engine)


@dataclass(frozen=True)
class Job:
    model: object                     # hpcpar.shape.ModelShape
    hardware: object                  # Hardware
    gpus: int
    gpus_per_node: int
    global_batch: int                 # sequences per step
    seq_len: int
    dtype: str = "bf16"               # bf16: mixed precision (fp32 master weights); fp32/fp64: plain
    engine: Engine = field(default_factory=Engine)
    keys: int = 0                     # keys a query meets: 0 the sequence; a packed window's attention_span

    @property
    def attended(self):
        """The keys the attention core computes per query (hpcpar/shape.py's attention_span)."""
        return self.keys or self.seq_len

    @property
    def elem_bytes(self):
        """Bytes of one activation or weight element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def nodes(self):
        return -(-self.gpus // self.gpus_per_node)

    def stage_layers(self, layout):
        """Layers on each pipeline rank, as the engine cuts them and the schedule places them."""
        return stage_layers(self.model.layers, layout.pp, self.engine.partition, layout.schedule, layout.v)

    def stage_classes(self, layout):
        """Per pipeline rank, (its layers, holds the embedding, holds the head): ranks alike in these are alike."""
        return stage_classes(self.model.layers, layout.pp, self.engine.partition, layout.schedule, layout.v)

    def ends(self, layout):
        """(the pipeline rank with the embedding, the one with the head): the schedule's placement."""
        return pipeline_ends(layout.schedule, layout.pp, layout.v)

    def micro_batches(self, layout):
        return self.global_batch // (layout.dp * layout.mb)

    def check(self, layout):
        """None if the layout's shapes divide, else the reason in one line."""
        m, lay = self.model, layout
        if lay.gpus != self.gpus:
            return f"tp*pp*dp = {lay.gpus}, not the {self.gpus} GPUs of the job"
        if lay.schedule not in SCHEDULES:
            return f"unknown schedule {lay.schedule} (use one of {', '.join(SCHEDULES)})"
        if m.heads % lay.tp or (m.kv_heads % lay.tp and lay.tp % m.kv_heads):
            return f"tp={lay.tp} does not divide the {m.heads} heads ({m.kv_heads} key/value heads)"
        if m.ffn % lay.tp:
            return f"tp={lay.tp} does not divide the MLP width {m.ffn}"
        if lay.pp > m.layers:
            return f"pp={lay.pp} stages for {m.layers} layers"
        if self.global_batch % (lay.dp * lay.mb):
            return f"global batch {self.global_batch} is not a multiple of dp*mb = {lay.dp * lay.mb}"
        if lay.sp and (lay.tp == 1 or self.seq_len % lay.tp):
            return "sequence parallelism needs tp > 1 dividing the sequence length"
        if lay.zero not in (0, 1, 2, 3):
            return f"ZeRO stage {lay.zero} (use 0 to 3)"
        if lay.zero and lay.shard == 1:
            return f"ZeRO-{lay.zero} needs dp * cp > 1" if not lay.dp_shard else \
                f"ZeRO-{lay.zero} over HSDP's shard groups of {lay.dp_shard} x cp {lay.cp} = 1 rank"
        if lay.dp_shard and (not lay.zero or lay.dp % lay.dp_shard):
            return f"HSDP's dp-shard {lay.dp_shard} needs ZeRO and must divide dp = {lay.dp}"
        if lay.dp_shard and lay.shard % lay.ep and lay.ep % lay.shard:
            return f"HSDP's shard group of {lay.shard} ranks and ep = {lay.ep} must divide one another"
        if lay.cp < 1 or self.seq_len % (2 * lay.cp if lay.cp > 1 else 1):
            return f"cp={lay.cp} does not split the sequence {self.seq_len} into 2*cp load-balanced chunks"
        if lay.cp_kind not in ("ring", "ulysses"):
            return f"unknown cp kind {lay.cp_kind} (ring or ulysses)"
        if lay.cp_kind == "ulysses" and (m.heads // lay.tp % lay.cp or kv_heads_per_rank(m, lay.tp) % lay.cp):
            return (f"ulysses needs cp={lay.cp} to divide the {m.heads // lay.tp} heads and "
                    f"{kv_heads_per_rank(m, lay.tp)} key/value heads of a tp rank")
        reason = expert_check(m, lay)
        if reason:
            return reason
        kind = KINDS[lay.schedule]
        if kind.chunked:
            if lay.pp < 2:
                return f"the {lay.schedule} schedule needs pp >= 2"
            if m.layers // lay.pp < lay.v:
                return f"{lay.v} chunks per rank need at least {lay.v} layers per stage"
            if not kind.v_shape and self.micro_batches(lay) % lay.pp:   # Megatron's groups of p
                return f"interleaving needs the micro-batch count {self.micro_batches(lay)} to be a multiple of pp"
        # chunks and micro-batches as the schedule module builds them (a V: exactly 2 chunks, dualpipev 2p)
        return refusal(lay.schedule, lay.pp, self.micro_batches(lay), lay.v)
