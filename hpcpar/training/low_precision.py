"""FP8/FP4 training on the grid: quantised GEMMs put into the layers, their amax groups, what users see.

``LowPrecision(cfg, grid, chunks)`` gives every linear layer inside the blocks this rank holds its
``QuantisedGemms`` (fp8/gemm.py) - not the embedding, the output head or a mixture of experts, and
not the blocks the recipe keeps in high precision - with the reductions its scales need: for each
operand of each GEMM, the max over the tensor- or context-parallel group that cuts each of its
axes (fp8/layout.py ``axes``), so that the scales are those of the whole tensor one rank would hold.
Under delayed scaling, ``end_step`` reduces the step's amax of every operand over the ranks that ran
the layer (tp x cp x dp: every replica and micro-batch of the step) and appends it to the history.

``Fp8Report`` (an observer of the loop, training/observers.py): every step, the figures of every rank merged on rank 0
(fp8/stats.py) - into the metrics record (``fp8``), into a warning the first time an operand's amax
leaves its format's range, and at the end into a summary line and, with ``--profile``, the table.
"""
import numpy as np

from hpcpar.fp8.gemm import AmaxHistory, QuantisedGemms
from hpcpar.fp8.layout import axes
from hpcpar.fp8.recipes import OPERANDS, RECIPES, high_precision_blocks, with_block
from hpcpar.nn.linear import Linear, Projections
from hpcpar.nn.module import Module
from hpcpar.nn.moe import MoE
from hpcpar.tensor_parallel.layers import ColumnParallelLinear, ColumnParallelProjections, RowParallelLinear

KINDS = ((ColumnParallelLinear, "column"), (RowParallelLinear, "row"), (Linear, "serial"))


def recipe_of(cfg):
    return with_block(RECIPES[cfg.precision], cfg.fp8_block)


def linears(module, prefix=""):
    """(layer name, layer, kind) of every linear layer under ``module``, a mixture of experts left out."""
    if isinstance(module, MoE):
        return
    for cls, kind in KINDS:
        if isinstance(module, cls):
            yield module.weight.name.rsplit(".", 1)[0], module, kind
            return
    if isinstance(module, (Projections, ColumnParallelProjections)):
        for part in module.parts:
            yield from linears(part)
        return
    for value in vars(module).values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Module):
                yield from linears(item)


class LowPrecision:
    def __init__(self, cfg, grid, chunks, n_layer):
        self.recipe = recipe = recipe_of(cfg)
        comms = {"tp": grid.tp_comm, "cp": grid.cp_comm}
        reducers = {axis: (lambda a, c=c: c.all_reduce(a, op="max")) for axis, c in comms.items() if c.size > 1}
        high = high_precision_blocks(recipe, n_layer)
        self.layers = {}                                        # name -> QuantisedGemms
        for chunk in chunks:
            for block in chunk.blocks:
                index = int(block.parameters()[0].name.split(".")[1])      # h.3..., layers.3...
                if index in high:
                    continue
                for name, layer, kind in linears(block):
                    groups = {(g, o): tuple(reducers.get(a) for a in axes(kind, g, o))
                              for g, operands in OPERANDS.items() for o, _ in operands}
                    history = AmaxHistory(cfg.fp8_amax_history) if cfg.fp8_amax_history else None
                    layer.mm = self.layers[name] = QuantisedGemms(recipe, groups, history, cfg.fp8_accumulator_bits)
                    if cfg.fp8_param_gather:                    # ZeRO-3 gathers it quantised (fp8_gather.py)
                        layer.mm.weight = layer.weight
        self.tp_comm = grid.tp_comm
        # the ranks that ran the same layers this step: their amax make the history's
        self.replicas = grid.comm_over("tp", "dp", "cp") if cfg.fp8_amax_history else None

    def weights(self):
        """The weights of the quantised layers (--fp8-param-gather: ZeRO-3 gathers them as FP8 codes)."""
        return [q.weight for q in self.layers.values() if q.weight is not None]

    def start_step(self, sharding):
        """Before the step's first forward: forget what an evaluation quantised since the last step (its
        figures, its amax); with --fp8-param-gather, every FP8 unit's weights' scales, from their amax over
        the ZeRO group and tp (collective: two all-reduces for all of them; fp8_gather.py)."""
        for q in self.layers.values():
            q.take_figures()
            if q.history is not None:
                q.history.pending.clear()
        units = [u for u in getattr(sharding, "flats", ()) if hasattr(u, "set_scales")]
        if not units:
            return
        amax = units[0].group.all_reduce(np.concatenate([u.local_amax() for u in units]), op="max")
        amax = self.tp_comm.all_reduce(amax, op="max")
        at = 0
        for u in units:
            u.set_scales(amax[at:at + len(u.segments)])
            at += len(u.segments)

    def end_step(self):
        """Delayed scaling: this step's amax of every operand, reduced over the layer's replicas, into its
        history (collective over tp x dp x cp)."""
        if self.replicas is None:
            return
        order = [(name, key) for name, q in sorted(self.layers.items()) for key in q.history.keys()]
        mine = np.array([self.layers[name].history.pending[key] for name, key in order], dtype=np.float64)
        everyone = self.replicas.all_reduce(mine, op="max") if mine.size else mine
        for (name, key), amax in zip(order, everyone):
            self.layers[name].history.push(key, float(amax))
        for q in self.layers.values():
            q.history.pending.clear()

    def take_figures(self):
        """{layer: {(gemm, operand): Figures}} of this rank since the last call."""
        return {name: q.take_figures() for name, q in self.layers.items()}

    def scalings(self):
        return {o: self.recipe.scaling(o).describe() for o in ("x", "w", "dy")}
