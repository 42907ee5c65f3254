"""One training step of any tp x cp x pp x dp layout: the ``Trainer`` (its model and data: models.py; its
batches: batches.py; the groups its gradients are summed over: gradient_sums.py; the loop around it:
loop.py; its summary: summary.py).

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
from hpcpar import tracer as trace
from hpcpar.comm.device import select_device
from hpcpar.training.config import checked
from hpcpar.context_parallel import parallelize_context
from hpcpar.comm.grid import ParallelGrid
from hpcpar.training import plug
from hpcpar.training.batches import Batches
from hpcpar.training.gradient_sums import GradientSums
from hpcpar.training.documents import DocumentFigures
from hpcpar.training.expert_load import ExpertLoad
from hpcpar.training.low_precision import LowPrecision
from hpcpar.training.qk_clip import QKClip
from hpcpar.training.models import kind_of, micro_batch
from hpcpar.expert_parallel.dispatch import expert_groups, parallelize_experts
from hpcpar.ops.attention import engine_block
from hpcpar.optim import clip_coefficient, learning_rate, make_optimizer
from hpcpar.pipeline.choice import schedule_for
from hpcpar.pipeline.engine import PipelineEngine
from hpcpar.pipeline.partition import partition
from hpcpar.tensor_parallel import parallelize
from hpcpar.tensor_parallel.muon import muon_options


StepResult = namedtuple("StepResult", "loss grad_norm lr skipped stop")


class Trainer(Batches, GradientSums):
    def __init__(self, cfg, comm=None):
        from mpi4py import MPI
        comm = comm or MPI.COMM_WORLD
        if cfg.plug:                        # before the checks: the schedule's hang check runs a plugged order
            plug.install(plug.load(cfg.plug))
        self.cfg, (mcfg, self.data, self.val_data) = checked(cfg, comm.size)     # every refusal, then no more
        cfg, self.kind = self.cfg, kind_of(self.cfg)
        self.xp = backend.use(cfg.backend)
        self.dtype = backend.resolve_dtype(cfg.dtype)                           # master weights, gradients
        self.compute = precision.compute_dtype(precision.elsewhere(cfg.precision, cfg.fp8_rest), self.xp,
                                               self.dtype)                      # activations, GEMMs
        self.scaler = precision.LossScaler(dynamic=cfg.precision == "fp16")
        self.mcfg = mcfg
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
        self._sum_gradients()                   # the replicas and the other groups (gradient_sums.py)
        self.optimizer = make_optimizer(cfg.optimizer, cfg.lr, cfg.momentum, cfg.beta1, cfg.beta2, cfg.eps,
                                        cfg.weight_decay, **muon_options(cfg, g.tp_comm, self.xp))
        self.qk_clip = QKClip(cfg.qk_clip, self.chunks, g, mcfg.n_layer, mcfg.n_head, self.xp) if cfg.qk_clip else None
        self.micro = micro_batch(cfg)                                    # sequences per micro-batch
        self.engine = PipelineEngine(self.schedule, self.chunks, g.pp_comm, self._act_shape, self.compute)
        self.eval_engine = None                                          # built on the first evaluation
        # every token of the global batch: a DP rank sums over its sequences, a CP rank over its T/cp tokens
        # of each, so dividing the world's sum by this is the single-rank mean
        terms, tokens = self.kind.terms(mcfg)                  # of one sample
        self.every_term, self.tokens_per_step = cfg.batch_size * terms, cfg.batch_size * tokens
        self.loss_terms = self.every_term               # with --documents, the step's targets kept (batch_terms)
        self.expert_load = ExpertLoad(mcfg, self.chunks, g, self.loss_terms, cfg.sequence_parallel) \
            if self.kind.sequences else None
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
        held = {}                                            # virtual stage -> this rank's chunk of it
        for c in range(cfg.chunks):
            s = self.schedule.stage(g.pp_rank, c)
            held[s] = self.kind.stage(mcfg, cfg.seed, self.dtype, layers=ranges[s], first=s == 0, last=s == S - 1)
        chunks = list(held.values())
        if self.kind.ties_ends(mcfg) and S > 1 and 0 in held and S - 1 in held:
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
        return self.kind.activation(self.cfg, self.mcfg, self.micro)

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
        g = self.grid
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
