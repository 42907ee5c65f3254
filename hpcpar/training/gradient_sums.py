"""Which ranks sum each of this rank's gradients, and how ZeRO cuts its state - part of the ``Trainer``
(step.py), made once the model's chunks are built.

    the replicas         every rank holding the same numbers: dp x cp, or for an expert (dp x cp) / ep;
                         ZeRO cuts a parameter's state over its shard group (all of them, or HSDP's
                         --dp-shard of them, protocol.shard_groups) and all-reduces across the groups
    the tied embedding   its two copies on the pipeline's two ends (a tied head, the MTP modules' lookups)
    partial sums         sequence parallelism's norms, each tp rank's share of a replicated parameter

The replicas' sums run in the data parallelism (data_parallel/: buckets under ZeRO 0-2, units under
ZeRO-3), which the stages report their final gradients to; the other two are summed first, when the
backward ends (``_late_sums``).
"""
from hpcpar.data_parallel.fp8_gather import Fp8Unit
from hpcpar.data_parallel.fsdp import FullyShardedDataParallel
from hpcpar.data_parallel.protocol import shard_groups
from hpcpar.data_parallel.replicas import DataParallel
from hpcpar.data_parallel.zero_memory import shard_size
from hpcpar.training.expert_load import moe_layers


class GradientSums:
    def _sum_gradients(self):
        """The groups above, and the data parallelism (``self.dp``) the stages report to."""
        cfg, g, mcfg = self.cfg, self.grid, self.mcfg
        params = self.parameters()
        # both copies of a tied embedding (or the one the MTP modules look up), when the two ends sit on two
        # pipeline ranks; their gradients are summed over those two ranks (one rank holding both ends ties
        # them in _build_chunks)
        summed = self.schedule.embedding_ranks(self.kind.ties_ends(mcfg))
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
