"""What quantisation did to each GEMM operand: merged over ranks, as a table, a summary line, warnings.

Every rank records, per layer and per (GEMM, operand), the ``quantise.Figures`` of the values it
quantised (fp8/gemm.py).  Merging sums them over ranks and micro-batches: a piece held by one rank
adds its own error, a copy held by several ranks (a replicated input over tp) adds the same ratio
again, so the relative error of the merge is that of the whole operand on one rank.

    rel err     sqrt(sum (t' - t)^2 / sum t^2): the operand's relative error after rounding
    saturated   the share of values beyond the format's largest (delayed scaling, a clamped scale)
    flushed     the share of nonzero values rounded to zero (below the format's smallest, scaled)
    scales      the smallest and largest decode scale (what a code is multiplied by)
"""
import math

from hpcpar.fp8.quantise import Figures
from hpcpar.fp8.recipes import OPERANDS


def merge(per_rank):
    """{layer: {(gemm, operand): Figures}} summed over a list of such dicts (one per rank)."""
    out = {}
    for figures in per_rank:
        for layer, ops in figures.items():
            mine = out.setdefault(layer, {})
            for key, f in ops.items():
                mine.setdefault(key, Figures()).add(f)
    return out


def rel_err(f):
    return math.sqrt(f.err2 / f.ref2) if f.ref2 else 0.0


def row(f):
    """The figures of one operand as numbers (the metrics file's form)."""
    n = max(f.n, 1)
    return {"rel_err": rel_err(f), "saturated": f.overflow / n, "flushed": f.flushed / n,
            "scale_min": f.scale_lo if f.n else 0.0, "scale_max": f.scale_hi, "amax": f.amax}


def total(merged):
    """Every operand of every layer summed: one Figures."""
    out = Figures()
    for ops in merged.values():
        for f in ops.values():
            out.add(f)
    return out


def worst(merged):
    """(layer, gemm, operand, relative error) of the operand that lost the most."""
    return max(((layer, g, o, rel_err(f)) for layer, ops in merged.items() for (g, o), f in ops.items()),
               key=lambda r: r[3], default=None)


def metrics(merged):
    """The step's record: the whole and each layer's operands."""
    return {**row(total(merged)),
            "layers": {layer: {f"{g}.{o}": row(f) for (g, o), f in sorted(ops.items())}
                       for layer, ops in merged.items()}}


def summary_line(recipe, merged):
    all_ = row(total(merged))
    w = worst(merged)
    where = f" (most: {w[0]} {w[1]} {w[2]}, {100 * w[3]:.2f}%)" if w else ""
    return (f"{recipe}: GEMM inputs' relative error {100 * all_['rel_err']:.2f}%{where}, "
            f"{100 * all_['saturated']:.3f}% saturated, {100 * all_['flushed']:.3f}% flushed to zero")


def table(recipe, scalings, merged):
    """The per-layer, per-GEMM report (``--profile``): one line per operand."""
    lines = [f"quantised GEMM inputs ({recipe}; rel err = |t' - t| / |t|, decode scales min..max):",
             f"  {'layer':<22} {'GEMM':<8} {'operand':<8} {'scaling':<18} {'rel err':>8} {'saturated':>10} "
             f"{'flushed':>8}  scales"]
    for layer in sorted(merged, key=_layer_order):
        ops = merged[layer]
        for g, operands in OPERANDS.items():
            for o, _ in operands:
                if (g, o) not in ops:
                    continue
                r = row(ops[(g, o)])
                lines.append(f"  {layer:<22} {g:<8} {o:<8} {scalings[o]:<18} {100 * r['rel_err']:>7.3f}% "
                             f"{100 * r['saturated']:>9.4f}% {100 * r['flushed']:>7.3f}%  "
                             f"{r['scale_min']:.3g}..{r['scale_max']:.3g}")
    return "\n".join(lines)


def warnings(merged, seen):
    """One line per operand whose amax left the format's range for the first time (``seen``: the keys
    already warned about, updated)."""
    out = []
    for layer in sorted(merged, key=_layer_order):
        for (g, o), f in sorted(merged[layer].items()):
            bad = f.overflow or f.clamped or not math.isfinite(f.amax)
            if bad and (layer, g, o) not in seen:
                seen.add((layer, g, o))
                why = (f"amax {f.amax:.4g} is not finite" if not math.isfinite(f.amax) else
                       f"{f.overflow} of {f.n} values beyond the format's largest (amax {f.amax:.4g}): saturated"
                       if f.overflow else f"{f.clamped} block scales outside their own format's range")
                out.append(f"hpcpar: warning: {layer} {g} GEMM, {o}: {why}")
    return out


def _layer_order(name):
    """h.10 after h.9: the block number as a number."""
    parts = name.split(".")
    return [int(p) if p.isdigit() else 0 for p in parts[:2]] + [name]
