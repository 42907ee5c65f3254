"""A linear layer's three GEMMs under a recipe: both operands quantised, then multiplied.

    forward   y  = Q(x) Q(W)            Q: quantise.quantise with the recipe's scaling of that operand,
    input     dx = Q(dy) Q(W^T)            along that GEMM's contraction
    weight    dW = Q(x^T) Q(dy)

Both operands are quantised in the accumulator's dtype (fp32 for a bf16 step: a scaled value does
not fit bf16's 8 bits; float64 when the run is float64), and the GEMM of the values they stand for
goes through the one GEMM door, ``precision.gemm`` - the provider that multiplies every other GEMM
of the step - its output rounded once to the step's dtype.  On the GPU the FP8 tensor cores take the
codes and apply the scales after the products; here the scales are applied first, which differs by
one rounding per value in fp32 and not at all in float64 (a code times an fp32 scale is exact there).

Blockwise's promotion (DeepSeek-V3, section 3.3.2): its tensor cores keep about 14 bits of the
running sum; every 128 K-elements the partial sum is promoted into an fp32 register.  With
``accumulator_bits`` set, ``limited_gemm`` reproduces that: the K axis is summed in steps of 32 (one
FP8 MMA instruction's K) into an accumulator rounded to that many mantissa bits, promoted to fp32
every ``promote`` K-elements (never, when the recipe has no promotion).

Delayed scaling (``history``): a tensor's scale comes from the largest amax of the last H steps
(``AmaxHistory``), so the GEMM needs no reduction across ranks; this step's amax is recorded for the
next ones, and reduced over every rank that ran the layer at the end of the step.
"""
from collections import deque


from hpcpar.backend import array_module
from hpcpar.fp8.quantise import Figures, quantise
from hpcpar.fp8.recipes import OPERANDS
from hpcpar.precision import accumulator, gemm


class AmaxHistory:
    """The amax of each operand over the last ``length`` steps (Transformer Engine's amax_history)."""

    def __init__(self, length):
        self.length = length
        self.steps = {}             # (gemm, operand) -> deque of the last steps' amax (every rank's max)
        self.pending = {}           # (gemm, operand) -> this step's amax on this rank so far

    def amax(self, key):
        """The amax that sets this step's scale; None before the first step has been recorded."""
        past = self.steps.get(key)
        return max(past) if past else None

    def record(self, key, amax):
        self.pending[key] = max(self.pending.get(key, 0.0), amax)

    def keys(self):
        return sorted(self.pending)

    def push(self, key, amax):
        self.steps.setdefault(key, deque(maxlen=self.length)).append(amax)


class QuantisedGemms:
    """Called as ``gemms(which, a, b, segment)`` by ops/linear.py for which in forward, input, weight.
    ``groups``: {(gemm, operand): (reduce over axis 0, reduce over axis 1)} as quantise takes them;
    ``figures``: {(gemm, operand): Figures}, summed over the calls until the caller takes them."""

    def __init__(self, recipe, groups=None, history=None, accumulator_bits=0):
        self.recipe, self.groups, self.history = recipe, groups or {}, history
        self.accumulator_bits = accumulator_bits
        self.figures = {}
        self.weight = None          # --fp8-param-gather: the Parameter, gathered already quantised when
        #                             its fp8_scale is set (data_parallel/fp8_gather.py)

    def __call__(self, which, a, b, segment=0, dtype=None):
        """a @ b of the ``which`` GEMM ("forward", "input", "weight"), each operand quantised by the recipe;
        the fp32 (float64) sum returned in ``dtype`` (None: a's, rounded once)."""
        (name_a, _), (name_b, _) = OPERANDS[which]
        acc = accumulator(a.dtype)
        seg = segment if which == "weight" else 0          # the token axis is the weight GEMM's contraction
        va = self.quantise(which, name_a, a.astype(acc, copy=False), 1, seg)
        vb = self.quantise(which, name_b, b.astype(acc, copy=False), 0, seg)
        if self.accumulator_bits:
            y = limited_gemm(va, vb, self.accumulator_bits, self.recipe.promote)
        else:
            y = gemm(va, vb)
        return y.astype(dtype or a.dtype, copy=False)

    def quantise(self, which, operand, t, contraction, segment):
        if operand == "w" and getattr(self.weight, "fp8_scale", None) is not None:
            return t                                            # on the grid of its own scale already
        key = (which, operand)
        scaling = self.recipe.scaling(operand)
        amax = None
        if self.history is not None and scaling.kind == "tensor":
            amax = self.history.amax(key)
            amax = scaling.fmt.max if amax is None else amax      # no history yet: scale 1
        q = quantise(t, scaling, contraction, self.groups.get(key, (None, None)), segment, amax)
        if self.history is not None and scaling.kind == "tensor":
            self.history.record(key, q.figures.amax)
        self.figures.setdefault(key, Figures()).add(q.figures)
        return q.values

    def take_figures(self):
        out, self.figures = self.figures, {}
        return out


def limited_gemm(a, b, bits, promote, k_step=32):
    """a @ b with the sum over K kept in an accumulator of ``bits`` mantissa bits (rounded toward zero,
    after every ``k_step`` elements), added into an fp32 sum every ``promote`` elements (0: at the end)."""
    xp = array_module(a)
    K = a.shape[1]
    total = xp.zeros((a.shape[0], b.shape[1]), dtype=accumulator(a.dtype))
    partial = xp.zeros_like(total)
    every = promote or K
    for k in range(0, K, k_step):
        partial = chop(partial + gemm(a[:, k:k + k_step], b[k:k + k_step]), bits)
        if (k + k_step) % every == 0 or k + k_step >= K:
            total += partial
            partial[...] = 0
    return total


def chop(y, bits):
    """y with its mantissa cut to ``bits`` bits (toward zero): a narrow accumulator."""
    xp = array_module(y)
    m, e = xp.frexp(y)
    return xp.ldexp(xp.trunc(m * 2.0 ** bits) / 2.0 ** bits, e).astype(y.dtype)
