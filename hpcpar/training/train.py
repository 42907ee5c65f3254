"""The training step of any tp x cp x pp x dp layout (the loop around it: loop.py; its summary: summary.py).

One step, on every rank (docs/3d.md walks through it):

 1. take this DP rank's share of the global batch (sample ids dp_rank * B/dp ...), cut into micro-batches;
    (context parallelism) keep this CP rank's two chunks of every sequence, and their global positions
 2. run the pipeline schedule: forwards and backwards of the micro-batches through this rank's chunks,
    activations and gradients flowing to the neighbouring stages; inside every layer the TP group
    shares the GEMMs, and the CP group passes attention's key/value blocks round its ring; as the last
    backward finishes each bucket, its all-reduce over DP x CP (every rank with the same parameters) starts
 3. sum the tied-embedding gradients of the first and last stage, and (sequence parallelism) the
    partial gradients of the replicated parameters over TP; then wait for every DP bucket
 4. one all-reduce of (loss, squared gradient norm) over the world; clip; optimizer step on this
    rank's flat slices; (ZeRO-1, 2) all-gather the parameters (ZeRO-3 gathers each unit when it is used)

Every rank therefore ends the step with its shard of exactly the parameters one rank alone would have.
"""
import contextlib
import math
import time
from collections import namedtuple

import numpy as np

from hpcpar import backend, blas, faults, precision
from hpcpar.trace import tracer as trace
from hpcpar.checkpoint.hf import family as hf_family
from hpcpar.comm.device import select_device
from hpcpar.training.config import check
from hpcpar.context_parallel import check_context_parallel, parallelize_context
from hpcpar.data import MarkovLanguage, Regression, TokenFile, validation_file
from hpcpar.data_parallel.protocol import shard_groups
from hpcpar.data_parallel.replicas import DataParallel
from hpcpar.data_parallel.fsdp import FullyShardedDataParallel
from hpcpar.data_parallel.fp8_gather import Fp8Unit
from hpcpar.comm.grid import ParallelGrid
from hpcpar.nn import GPT, Context, MLPConfig, MLPModel
from hpcpar.training import plug
from hpcpar.training.documents import DocumentFigures
from hpcpar.training.expert_load import ExpertLoad, moe_layers
from hpcpar.training.qk_clip import QKClip
from hpcpar.training.low_precision import LowPrecision, recipe_of
from hpcpar.fp8.layout import refusal as fp8_refusal
from hpcpar.expert_parallel.dispatch import expert_groups, parallelize_experts
from hpcpar.nn.dims import parse_dims
from hpcpar.nn.gpt import preset
from hpcpar.nn.moe import check_moe, moe_options
from hpcpar.nn.mtp import mtp_targets
from hpcpar.ops.attention import engine_block
from hpcpar.ops.masks import Mask, kept_targets, windowed_layers
from hpcpar.ops.ring_attention import balanced_positions, document_balance
from hpcpar.optim import clip_coefficient, learning_rate, make_optimizer
from hpcpar.pipeline.choice import schedule_for
from hpcpar.pipeline.engine import PipelineEngine
from hpcpar.pipeline.partition import partition
from hpcpar.pipeline.schedules import KINDS
from hpcpar.runtime import UsageError
from hpcpar.tensor_parallel import parallelize
from hpcpar.tensor_parallel.parallelize import check_divisible
from hpcpar.tensor_parallel.muon import muon_options
from hpcpar.data_parallel.zero_memory import check_budget, shard_size


StepResult = namedtuple("StepResult", "loss grad_norm lr skipped stop")


def make_data(cfg, seq_len):
    if cfg.model == "mlp":
        return Regression(MLPConfig().d_in, MLPConfig().d_out, cfg.seed)
    if cfg.data == "synthetic":
        return MarkovLanguage(cfg.synthetic_vocab, cfg.synthetic_order, cfg.synthetic_branching,
                              seq_len=seq_len, seed=cfg.seed, doc_len=cfg.synthetic_doc_len,
                              skip_boundaries=cfg.documents and not cfg.boundary_targets)
    return TokenFile(cfg.data, seq_len, cfg.batch_size, cfg.seed, cfg.data_order, cfg.token_dtype)


def make_validation_data(cfg, seq_len):
    """The val.bin beside the training tokens, for --eval-every; refused when there is none."""
    if not cfg.eval_every:
        return None
    val = validation_file(cfg.data) if cfg.model != "mlp" and cfg.data != "synthetic" else None
    if val is None:
        raise UsageError(f"--eval-every needs a val.bin beside the training tokens (hpcpar data prepare writes "
                         f"one); --data {cfg.data} has none")
    return TokenFile(val, seq_len, cfg.batch_size, cfg.seed, "random", cfg.token_dtype)


def model_config(cfg):
    """The model's dimensions from the preset and the explicit flags, checked against the layout."""
    if cfg.model == "mlp":
        base = MLPConfig()
        mcfg = MLPConfig(d_in=base.d_in, d_model=cfg.hidden or base.d_model,
                         d_ff=cfg.ffn or 2 * (cfg.hidden or base.d_model), n_layer=cfg.layers or base.n_layer,
                         d_out=base.d_out)
    else:
        heads = cfg.heads or None
        mcfg = preset(cfg.model, n_layer=cfg.layers or None, d_model=cfg.hidden or None,
                      n_head=heads, n_kv_head=cfg.kv_heads or heads, head_dim=cfg.head_dim or None,
                      seq_len=cfg.seq_len or None,
                      dropout=cfg.dropout, tied=False if cfg.untied else None,
                      d_ff=cfg.ffn or (4 * cfg.hidden if cfg.hidden else None),
                      positions=cfg.positions or None, ln_eps=cfg.ln_eps or None, rope_theta=cfg.rope_theta or None,
                      norm_topk=cfg.norm_topk, window=cfg.window or None, window_layers=cfg.window_layers or None,
                      mtp_depth=cfg.mtp or None, mtp_lambda=cfg.mtp_lambda, **moe_options(cfg), **parse_dims(cfg.dims))
        windowed_layers(mcfg.window_layers, mcfg.n_layer)          # a bad --window-layers, refused here
        if mcfg.seq_len > mcfg.n_positions:
            raise UsageError(f"--seq-len {mcfg.seq_len} is longer than the model's {mcfg.n_positions} positions")
        if not mcfg.head_dim and mcfg.d_model % mcfg.n_head:
            raise UsageError(f"--heads {mcfg.n_head} must divide --hidden {mcfg.d_model}")
        if not mcfg.parts.grouped_kv and cfg.kv_heads:
            raise UsageError(f"--kv-heads needs a Llama model (--model llama-tiny or llama-small), not {cfg.model}")
        if mcfg.n_head % mcfg.n_kv_head:
            raise UsageError(f"--kv-heads {mcfg.n_kv_head} must divide the {mcfg.n_head} attention heads")
        if cfg.qk_clip and mcfg.qk_norm:
            raise UsageError("--qk-clip scales W_q and W_k, and QK-norm normalises q and k again: use one of them")
        if not mcfg.parts.dropout and cfg.dropout:
            raise UsageError(f"--model {cfg.model} has no dropout: drop --dropout {cfg.dropout}")
        if mcfg.mtp_depth >= mcfg.seq_len:
            raise UsageError(f"--mtp {mcfg.mtp_depth} leaves no target in a sequence of {mcfg.seq_len} tokens")
    stages = cfg.pp * cfg.chunks
    if mcfg.n_layer < stages:
        raise UsageError(f"{mcfg.n_layer} layers cannot fill pp x chunks = {cfg.pp} x {cfg.chunks} = {stages} stages")
    if KINDS[cfg.schedule].chunked and cfg.partition == "uniform" and mcfg.n_layer % stages:
        raise UsageError(f"{cfg.schedule}: {mcfg.n_layer} layers do not divide into pp x chunks = "
                         f"{cfg.pp} x {cfg.chunks} = {stages} equal chunks")
    if cfg.model != "mlp":
        check_moe(mcfg, cfg)
        if not (mcfg.n_expert or cfg.norm_topk):
            raise UsageError("--no-norm-topk needs experts: give --experts N or a model with them")
        if cfg.export:
            hf_family(mcfg)                     # refuses, before the run, a model no Hugging Face file holds
    check_divisible(mcfg, cfg.tp, cfg.sequence_parallel, getattr(mcfg, "seq_len", None))
    check_context_parallel(cfg.cp, getattr(mcfg, "seq_len", 0), cfg.tp, cfg.sequence_parallel, cfg.cp_kind,
                           getattr(mcfg, "n_head", 0), getattr(mcfg, "n_kv_head", 0))
    if cfg.precision in precision.FP8:                  # no scaling block may straddle two ranks
        refused = fp8_refusal(recipe_of(cfg), mcfg, cfg.tp, cfg.cp, cfg.documents)
        if refused:
            raise UsageError(refused)
    return mcfg


def with_vocab(cfg, mcfg, data):
    """A GPT takes its vocabulary from the data unless --vocab (or the preset) fixes it."""
    if cfg.model == "mlp":
        return mcfg
    from dataclasses import replace
    vocab = cfg.vocab or mcfg.vocab_size or data.vocab_size
    if data.vocab_size > vocab:
        raise UsageError(f"the data has {data.vocab_size} token ids but the model's vocabulary is {vocab}")
    return replace(mcfg, vocab_size=vocab)


class Trainer:
    def __init__(self, cfg, comm=None):
        from mpi4py import MPI
        comm = comm or MPI.COMM_WORLD
        if cfg.plug:                        # before the checks: the schedule's hang check runs a plugged order
            plug.install(plug.load(cfg.plug))
        self.cfg = cfg = check(cfg, comm.size)
        self.xp = backend.use(cfg.backend)
        self.dtype = backend.resolve_dtype(cfg.dtype)                           # master weights, gradients
        self.compute = precision.compute_dtype(precision.elsewhere(cfg.precision, cfg.fp8_rest), self.xp,
                                               self.dtype)                      # activations, GEMMs
        self.scaler = precision.LossScaler(dynamic=cfg.precision == "fp16")
        mcfg = model_config(cfg)
        self.data = make_data(cfg, getattr(mcfg, "seq_len", 0))
        self.val_data = make_validation_data(cfg, getattr(mcfg, "seq_len", 0))
        self.mcfg = mcfg = with_vocab(cfg, mcfg, self.data)
        check_budget(cfg, mcfg)
        # --- all checks done: from here on, ranks communicate --------------------------------------
        self.grid = g = ParallelGrid(comm, cfg.order, tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, cp=cfg.cp)
        if cfg.backend == "numpy":      # the host's GEMM library: rank 0 chooses (auto probes), all use it
            choice = None if comm.rank else blas.choose(cfg.gemm, self.compute)
            name, why = comm.bcast(choice and (choice[0].name, choice[1]))
            blas.use(blas.load(name), why)
        if cfg.backend == "cupy":
            select_device(comm)
            if cfg.tf32:
                precision.allow_tf32(self.xp)
        self.schedule = schedule_for(cfg)
        # the schedule's placement says which pipeline ranks read the inputs (virtual stage 0) and the
        # targets (the last stage, which computes the loss)
        first, last = self.schedule.ends()
        self.reads_inputs, self.computes_loss = g.pp_rank == first, g.pp_rank == last
        self.chunks = self._build_chunks()
        # FP8/FP4: the blocks' linear layers get their quantised GEMMs (low_precision.py)
        self.low_precision = LowPrecision(cfg, g, self.chunks, mcfg.n_layer) if cfg.precision in precision.FP8 \
            else None
        params = self.parameters()
        # both copies of a tied embedding (or the one the MTP modules look up), when the two ends sit on two
        # pipeline ranks; their gradients are summed over those two ranks (one rank holding both ends ties
        # them in _build_chunks)
        summed = self.schedule.embedding_ranks(cfg.model != "mlp" and bool(mcfg.tied or mcfg.mtp_depth))
        self.embed_comm = g.comm_among("pp", summed, "embed") if summed else None
        self.tied = [p for p in params if self.embed_comm and p.name == mcfg.parts.tokens]
        partial = [p for p in params if p.tp_partial]
        uses = {}
        for chunk in self.chunks:
            for p in chunk.parameters():
                uses[id(p)] = uses.get(id(p), 0) + 1
        # ZeRO's cut of each parameter's replicas: (shard, across), HSDP's groups when --dp-shard is given
        shard = shard_size(cfg.dp, cfg.cp, cfg.dp_shard)
        self.cuts = {False: shard_groups(g, g.dp_cp_comm, shard)}
        if self.edp_comm is not None:
            self.cuts[True] = shard_groups(g, self.edp_comm, max(1, shard // cfg.ep))
        if cfg.zero == 3:
            # the routing biases, moved after the step on every rank alike (nn/moe.py), stay whole
            biases = [m.bias for m in moe_layers(self.chunks).values() if m.bias is not None]
            self.dp = FullyShardedDataParallel(self.chunks, g.dp_cp_comm, uses, self.compute, alone=self.tied,
                                               blocks_per_unit=cfg.fsdp_blocks,
                                               reshard_after_forward=cfg.reshard_after_forward,
                                               groups_of=self.groups_of, whole=biases,
                                               whole_tensors=cfg.whole_tensors,
                                               fp8=self.low_precision.weights() if cfg.fp8_param_gather else (),
                                               fp8_unit=Fp8Unit)
        else:
            self.dp = DataParallel(params, g.dp_cp_comm, cfg.bucket_mb, cfg.zero, late=self.tied + partial,
                                   uses=uses, compute_dtype=self.compute, groups=self._grad_groups(),
                                   groups_of=self.groups_of, whole_tensors=cfg.whole_tensors)
        self.dp.attach(self.chunks)                     # the stages report to it (nn/stage.py's door)
        self.partial = partial
        self.optimizer = make_optimizer(cfg.optimizer, cfg.lr, cfg.momentum, cfg.beta1, cfg.beta2, cfg.eps,
                                        cfg.weight_decay, **muon_options(cfg, g.tp_comm, self.xp))
        self.qk_clip = QKClip(cfg.qk_clip, self.chunks, g, mcfg.n_layer, mcfg.n_head, self.xp) if cfg.qk_clip else None
        self.micro = cfg.batch_size // (cfg.dp * cfg.microbatches)      # sequences per micro-batch
        self.engine = PipelineEngine(self.schedule, self.chunks, g.pp_comm, self._act_shape, self.compute)
        self.eval_engine = None                                          # built on the first evaluation
        is_gpt = cfg.model != "mlp"
        # every token of the global batch: a DP rank sums over its sequences, a CP rank over its T/cp tokens
        # of each, so dividing the world's sum by this is the single-rank mean
        self.every_term = cfg.batch_size * (mcfg.seq_len if is_gpt else mcfg.d_out)
        self.loss_terms = self.every_term               # with --documents, the step's targets kept (batch_terms)
        self.tokens_per_step = cfg.batch_size * (mcfg.seq_len if is_gpt else 1)
        self.expert_load = ExpertLoad(mcfg, self.chunks, g, self.loss_terms, cfg.sequence_parallel) \
            if is_gpt else None
        self.experts = None                             # the last step's routing figures (expert_load.py)
        # what the documents did to attention (documents.py), for the blocks the engine runs on this xp
        self.doc_figures = DocumentFigures(mcfg.seq_len, cfg.cp, g.cp_rank, cfg.cp_kind == "ring",
                                           engine_block(self.xp.empty((mcfg.seq_len, 1)))) if cfg.documents else None
        self.mtp_loss = None                            # the last step's MTP loss (nn/mtp.py), with --mtp
        self.reducing = self.totals = None              # the step whose totals were asked for; (step, totals)

    # --- construction -------------------------------------------------------------------------

    def _build_chunks(self):
        cfg, g, mcfg = self.cfg, self.grid, self.mcfg
        S = cfg.pp * cfg.chunks
        ranges = partition(mcfg.n_layer, S, cfg.partition, mcfg)
        Model = MLPModel if cfg.model == "mlp" else GPT
        held = {}                                            # virtual stage -> this rank's chunk of it
        for c in range(cfg.chunks):
            s = self.schedule.stage(g.pp_rank, c)
            held[s] = Model(mcfg, cfg.seed, self.dtype, layers=ranges[s], first=s == 0, last=s == S - 1)
        chunks = list(held.values())
        if cfg.model != "mlp" and (mcfg.tied or mcfg.mtp_depth) and S > 1 and 0 in held and S - 1 in held:
            held[S - 1].tie_to(held[0].embed.wte)           # one rank holds both ends (pp = 1 interleaved, a V)
        self.ep_comm, self.edp_comm = expert_groups(g, cfg.ep) if cfg.ep > 1 else (None, None)
        for chunk in chunks:
            parallelize(chunk, g.tp_comm, cfg.sequence_parallel)
            parallelize_context(chunk, g.cp_comm, cfg.cp_kind)
            if self.ep_comm is not None:
                parallelize_experts(chunk, self.ep_comm)
            chunk.set_recompute(cfg.recompute, cfg.recompute_attention)
        return chunks

    def _act_shape(self, mb):
        if self.cfg.model == "mlp":
            return (self.micro, self.mcfg.d_model)
        T = self.mcfg.seq_len // self.cfg.cp // (self.cfg.tp if self.cfg.sequence_parallel else 1)
        return (self.micro, T, self.mcfg.d_model)

    def _contexts_and_batches(self, step, data=None, training=True):
        cfg, g, data = self.cfg, self.grid, data or self.data
        base = g.dp_rank * (cfg.batch_size // cfg.dp)
        # every sample is drawn from its own key (seed, step, s), so this rank's share of the batch is
        # drawn in one call and cut into micro-batches: the same tokens as a call per micro-batch, but
        # the synthetic language's loop over positions runs once a step, not once a micro-batch
        share = range(base, base + cfg.microbatches * self.micro)
        xs, ys = data.batch(step, share) if (self.reads_inputs or self.computes_loss) else (None, None)
        docs = data.documents(step, share) if cfg.documents else None        # every rank: (B, T + 1) ids
        inputs, targets, contexts = [], [], []
        for j in range(cfg.microbatches):
            ids, mb = share[j * self.micro:(j + 1) * self.micro], slice(j * self.micro, (j + 1) * self.micro)
            x, y = (None, None) if xs is None else (xs[mb], ys[mb])
            ctx = Context(step=step, sample_ids=list(ids), seed=cfg.seed, training=training,
                          loss_scale=self.scaler.scale / self.loss_terms)     # the dloss of gradients()
            if docs is not None:                              # ops/masks.py: the rule, positions, the loss
                ctx.docs = docs[mb, :-1]
                ctx.keep = None if cfg.boundary_targets else kept_targets(docs[mb])
            if y is not None and getattr(self.mcfg, "mtp_depth", 0):     # (1 + D, B, T): the shifted targets
                y = mtp_targets(y, self.mcfg.mtp_depth,       # of the whole sequence, before CP cuts it; no
                                None if docs is None else docs[mb])      # shift past its own document
            if cfg.cp > 1:                                    # this CP rank's tokens: (B, T) -> (B, T/cp)
                if docs is not None:                          # the deal that balances the documents' work
                    ctx.cp_positions = document_balance(self.mcfg.seq_len, cfg.cp, Mask(ctx.docs))
                    ctx.positions = ctx.cp_positions[g.cp_rank]
                else:
                    ctx.positions = balanced_positions(self.mcfg.seq_len, cfg.cp, g.cp_rank)
                x, y = (None if a is None else a[..., ctx.positions] for a in (x, y))
                ctx.keep = None if ctx.keep is None else ctx.keep[:, ctx.positions]
            if docs is not None and training:
                self.doc_figures.add(ctx)
            inputs.append(self._device(x, self.compute) if self.reads_inputs else None)
            targets.append(self._device(y, self.dtype) if self.computes_loss else None)
            if cfg.sequence_parallel:
                T = self.mcfg.seq_len // cfg.cp                # the tokens this rank holds, cut over TP
                k = T // cfg.tp
                ctx.seq_slice, ctx.seq_len = slice(g.tp_rank * k, (g.tp_rank + 1) * k), T
            contexts.append(ctx)
        return inputs, targets, contexts

    def batch_terms(self, step, data=None):
        """The loss terms of step ``step``'s global batch: every target, or with --documents the targets
        that stay in their document - counted by every rank from the documents alone (no token drawn),
        so every rank divides by the same number."""
        cfg = self.cfg
        if not cfg.documents or cfg.boundary_targets:
            return self.every_term
        return max(1, int(kept_targets((data or self.data).documents(step, range(cfg.batch_size))).sum()))

    def _device(self, a, dtype):
        """Token ids stay integers; real values take ``dtype`` (inputs the compute one, targets the
        master one: a regression target is not rounded to a low precision)."""
        return self.xp.asarray(a, dtype=dtype if a.dtype.kind == "f" else None)

    # --- one step -----------------------------------------------------------------------------

    def gradients(self, step):
        """Forward and backward of step ``step``'s batch. Afterwards every gradient this rank holds is
        final: summed over micro-batches, DP replicas and tied copies (with ZeRO-1: this rank's ZeRO ranges).
        Returns this rank's per-micro-batch loss sums (non-empty on the last stage only)."""
        start = trace.active() and time.perf_counter()
        self.loss_terms = self.batch_terms(step)
        inputs, targets, contexts = self._contexts_and_batches(step)
        if start:
            trace.active().span("data", "data", start, time.perf_counter())
        self.dp.start_step()
        if self.low_precision is not None:
            self.low_precision.start_step(self.dp)          # --fp8-param-gather: the weights' scales
        dloss = self.scaler.scale / self.loss_terms         # fp16: the loss scaled up (precision.py)
        losses = self.engine.run(inputs, targets, contexts, dloss)
        self.dp.finish(self._late_sums())
        if self.low_precision is not None:
            self.low_precision.end_step()                   # delayed scaling's amax history
        return losses

    def step(self, step, stop_requested=False):
        """One optimizer step. ``stop_requested``: this rank got a stop signal (preemption).
        Returns StepResult(loss, grad_norm, lr, skipped, stop); ``stop`` is agreed by every rank."""
        cfg, g = self.cfg, self.grid
        faults.check_step(step, g.rank_id)
        # fp16: an overflow in the backward is the loss scaler's to handle (skip, lower the scale), not
        # numpy's to warn about
        with np.errstate(over="ignore", invalid="ignore") if self.scaler.dynamic else contextlib.nullcontext():
            losses = self.gradients(step)
        return self.update(step, losses, stop_requested)

    def update(self, step, losses, stop_requested=False):
        """The second half of ``step``, after ``gradients``: norm, clipping, the optimizer step."""
        slices = self.dp.slices()
        norm_sq = self.dp.norm_sq(slices)              # each parameter counted on one rank of its replicas
        # a failure inside the world's all-reduce may let some ranks through with the totals and stop
        # others: those keep their final gradients and take the totals from a survivor (training/recovery.py)
        self.reducing = step
        self.totals = (step, self.world_totals(losses, norm_sq, stop_requested))
        return self.apply(step, self.totals[1], slices)

    def apply(self, step, totals, slices):
        """Clip and apply this rank's final gradients, given the step's (loss, norm, stop, MTP loss) of
        world_totals."""
        cfg = self.cfg
        loss, norm, stop, self.mtp_loss = totals
        scale = self.scaler.scale
        norm /= scale                                   # the norm of the unscaled gradients
        lr = learning_rate(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
        finite = math.isfinite(loss) and math.isfinite(norm)
        self.scaler.update(math.isfinite(norm))
        if finite:
            coef = clip_coefficient(norm, cfg.grad_clip) / scale      # clip and undo the loss scale at once
            if coef != 1.0:
                for s in slices:
                    s.grad *= coef
            start = trace.active() and time.perf_counter()
            self.optimizer.step(slices, lr)
            if self.qk_clip is not None:
                self.qk_clip.step(self.dp, slices)
            self.dp.gather_params()
            if start:
                trace.active().span("optimizer", "optimizer", start, time.perf_counter())
        elif self.qk_clip is not None:
            self.qk_clip.step(self.dp, slices, apply=False)        # the maxima all the same (collective)
        self.dp.zero_grad()
        if self.expert_load is not None:
            self.experts = self.expert_load.step()
        return StepResult(loss, norm, lr, not finite, stop)

    def world_totals(self, losses, norm_sq=0.0, stop_requested=False):
        """Collective over the world: (the step's mean loss, the global gradient norm, whether any rank
        was asked to stop, the MTP modules' weighted mean loss or None) from this rank's per-micro-batch
        loss sums, squared-gradient share and MTP loss sum (nn/mtp.py, read and cleared here).

        One all-reduce gives every rank all of them, so all of them finish this step and stop together.
        The numbers stay on the device until after the reduction: the step's only device-to-host copy."""
        g, xp = self.grid, self.xp
        once = self.computes_loss and g.tp_rank == 0                           # the last stage, once
        mine = sum(losses) if once else 0.0
        values = [mine, norm_sq, float(stop_requested)]
        with_mtp = getattr(self.mcfg, "mtp_depth", 0)           # a fourth number only with MTP modules
        if with_mtp:
            mtp = [c.head.mtp for c in self.chunks if c.head is not None and c.head.mtp is not None]
            mtp_sum = sum((m.take_loss_sum() for m in mtp), 0.0)
            values.append(mtp_sum if once else 0.0)
        totals = backend.to_numpy(g.world_comm.all_reduce(xp.stack([xp.asarray(v, dtype=np.float64)
                                                                      for v in values])))
        mtp_loss = float(totals[3]) / self.loss_terms if with_mtp else None
        return float(totals[0]) / self.loss_terms, math.sqrt(totals[1]), totals[2] > 0, mtp_loss

    def evaluate(self, batches):
        """Collective: the mean loss on ``batches`` batches of the validation data, forward only (no
        dropout, no gradients).  Batch k is the same windows in every evaluation (key (seed, k)) and is
        split like a training batch, so every layout prints the single-rank number."""
        cfg, g = self.cfg, self.grid
        if self.eval_engine is None:
            forward = schedule_for(cfg, forward_only=True)
            self.eval_engine = PipelineEngine(forward, self.chunks, g.pp_comm, self._act_shape, self.compute)
        total, terms = 0.0, 0
        for k in range(batches):
            self.loss_terms = self.batch_terms(k, self.val_data)
            terms += self.loss_terms
            inputs, targets, contexts = self._contexts_and_batches(k, self.val_data, training=False)
            losses = self.eval_engine.run(inputs, targets, contexts, None)
            if self.computes_loss and g.tp_rank == 0:
                total += sum(float(loss) for loss in losses)
        total = g.world_comm.all_reduce(np.array([total]))
        return float(total[0]) / terms

    def _late_sums(self):
        """Gradients that are not final when the backward ends (see data_parallel/replicas.py): (communicator,
        parameters) pairs whose gradients are summed over it."""
        g = self.grid
        return [(comm, params) for comm, params in ((self.embed_comm, self.tied), (g.tp_comm, self.partial)) if params]

    def _grad_groups(self):
        """This rank's parameters as its chunks' backward passes report them final (Stage.grad_groups),
        last chunk first; a parameter two chunks share goes with the later report, where it is final."""
        groups, seen = [], set()
        for group in reversed([g for c in reversed(self.chunks) for g in c.grad_groups()]):
            groups.append([p for p in group if id(p) not in seen])
            seen.update(id(p) for p in group)
        return groups[::-1]

    def replica_comm(self, p):
        """The ranks that hold the same numbers as this one for ``p``, over which its gradient is summed:
        dp x cp, or an expert's (dp x cp) / ep (expert_parallel/dispatch.py)."""
        return self.edp_comm if p.expert else self.grid.dp_cp_comm

    def groups_of(self, p):
        """(shard, across): the groups ZeRO cuts ``p``'s state over and all-reduces its owned range over
        (protocol.shard_groups)."""
        return self.cuts[p.expert]

    def communicators(self):
        """The grid's communicators, the folded ones too (counted in the summary, profiled)."""
        return self.grid.communicators()

    def parameters(self):
        """This rank's parameters, each once (one rank may hold both ends of a tied embedding)."""
        seen, out = set(), []
        for p in (p for c in self.chunks for p in c.parameters()):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out
