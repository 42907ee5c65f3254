"""The recipes: how each operand of a linear layer's three GEMMs is scaled and into which format.

A linear layer y = x W (x (N, K): N tokens, K inputs; W (K, M)) runs three GEMMs, each summing over
one dimension - its *contraction* - and a scale must be constant along nothing that is summed, or it
cannot be taken out of the sum: every scale below runs along the contraction of its GEMM.

    GEMM      product      contraction   operand a (rows x contraction)   operand b (contraction x cols)
    forward   y  = x W     K             x   (N, K)                       W   (K, M)
    input     dx = dy W^T  M             dy  (N, M)                       W^T (M, K)
    weight    dW = x^T dy  N (tokens)    x^T (K, N)                       dy  (N, M)

The scalings (``Scaling.kind``):

    tensor   one scale for the whole operand: from this step's amax, or (``delayed``) the largest amax
             of the last H steps (Transformer Engine's delayed scaling; the first step uses scale 1)
    row      one per row of a / column of b: the amax along the contraction (torchao's rowwise)
    tile     one per 1 x B piece along the contraction (DeepSeek-V3's 1 x 128 activation tiles; in the
             weight GEMM, the 128 x 1 tiles of x and dy along the tokens, each within one sequence)
    block    one per B x B square (DeepSeek-V3's 128 x 128 weight blocks, NVFP4's 16 x 16)
    mx       one per 1 x 32 piece, a power of two (E8M0): 2^(floor(log2 amax) - emax of the element
             format) - the OCP MX v1.0 rule
    nvfp4    an fp32 scale for the whole operand and an E4M3 scale per 1 x 16 piece (or 16 x 16
             block for the weights), two levels (NVIDIA's NVFP4)

Recipes (sources in docs/precision.md):

    recipe          x            W              dy           values / grads   kept in high precision
    fp8-tensorwise  tensor       tensor         tensor       E4M3 / E5M2      embedding, head, router
    fp8-rowwise     row, 2^k     row, 2^k       row, 2^k     E4M3 / E4M3      "
    fp8-blockwise   tile 128     block 128      tile 128     E4M3 / E4M3      "  (+ promotion every 128)
    mxfp8           mx 32        mx 32          mx 32        E4M3 / E4M3      "
    nvfp4           nvfp4 16     nvfp4 16x16    nvfp4 16     E2M1 / E2M1      " and the last 16% of blocks
"""
from dataclasses import dataclass

from hpcpar.fp8.formats import E2M1, E4M3, E5M2, Format

GEMMS = ("forward", "input", "weight")
# each GEMM's operands: (name, its two dimensions as the GEMM takes them); the contraction is the
# second dimension of a and the first of b
OPERANDS = {"forward": (("x", "NK"), ("w", "KM")),
            "input": (("dy", "NM"), ("w", "MK")),
            "weight": (("x", "KN"), ("dy", "NM"))}
CONTRACTION = {"forward": "K", "input": "M", "weight": "N"}


@dataclass(frozen=True)
class Scaling:
    kind: str              # tensor, row, tile, block, mx, nvfp4
    fmt: Format            # the values' format
    block: int = 0         # tile, block, mx, nvfp4: the edge of a piece along the contraction (and across it
    square: bool = False   # ... for a B x B block: nvfp4's weights)
    pow2: bool = False     # scales rounded down to a power of two (torchao rowwise): exact to divide by

    def describe(self):
        shape = f"{self.block}x{self.block}" if self.kind == "block" or self.square else \
            (f"1x{self.block}" if self.block else "")
        return " ".join(filter(None, (self.fmt.name, self.kind, shape, "2^k" if self.pow2 else "")))


@dataclass(frozen=True)
class Recipe:
    name: str
    x: Scaling             # activations (forward) - and, along the tokens, in the weight GEMM
    w: Scaling             # weights (forward and input GEMMs)
    dy: Scaling            # output gradients (input and weight GEMMs)
    source: str
    promote: int = 0       # partial sums promoted to fp32 every this many K-elements (with a limited accumulator)
    high_last: float = 0.0  # the share of the last blocks whose linear layers stay in high precision
    param_gather: bool = False    # --fp8-param-gather possible: one scale per weight, known before the gather

    def scaling(self, operand):
        return getattr(self, operand)


RECIPES = {r.name: r for r in (
    Recipe("fp8-tensorwise", Scaling("tensor", E4M3), Scaling("tensor", E4M3), Scaling("tensor", E5M2),
           "torchao Float8 tensorwise (dynamic); Transformer Engine DelayedScaling with --fp8-amax-history",
           param_gather=True),
    Recipe("fp8-rowwise", Scaling("row", E4M3, pow2=True), Scaling("row", E4M3, pow2=True),
           Scaling("row", E4M3, pow2=True), "torchao Float8 rowwise (torchtitan)"),
    Recipe("fp8-blockwise", Scaling("tile", E4M3, 128), Scaling("block", E4M3, 128), Scaling("tile", E4M3, 128),
           "DeepSeek-V3 (1x128 tiles, 128x128 blocks); Transformer Engine Float8BlockScaling", promote=128),
    Recipe("mxfp8", Scaling("mx", E4M3, 32), Scaling("mx", E4M3, 32), Scaling("mx", E4M3, 32),
           "OCP Microscaling v1.0 MXFP8; torchao MXLinear, Transformer Engine MXFP8BlockScaling"),
    Recipe("nvfp4", Scaling("nvfp4", E2M1, 16), Scaling("nvfp4", E2M1, 16, square=True),
           Scaling("nvfp4", E2M1, 16), "NVIDIA, Pretraining LLMs with NVFP4 (2025), without Hadamard "
           "transforms and stochastic rounding", high_last=0.16),
)}


def with_block(recipe, block):
    """``recipe`` with its blocks' edge changed (``--fp8-block``: tiny models and tests; 0 keeps it)."""
    from dataclasses import replace
    if not block:
        return recipe
    return replace(recipe, **{o: replace(recipe.scaling(o), block=block) for o in ("x", "w", "dy")
                              if recipe.scaling(o).block})


def blocks_along(recipe, gemm, operand, dim):
    """The edge of the pieces that cut dimension ``dim`` (N, K or M) of ``operand`` in ``gemm``, else 0:
    a piece runs along the contraction, and a square block across it too."""
    s = recipe.scaling(operand)
    if not s.block:
        return 0
    square = s.kind == "block" or s.square
    return s.block if dim == CONTRACTION[gemm] or square else 0


def high_precision_blocks(recipe, n_layer):
    """Indices of the blocks this recipe keeps in high precision (NVFP4: the last 16%, at least one)."""
    if not recipe.high_last:
        return set()
    k = max(1, -(-int(recipe.high_last * n_layer * 100) // 100))
    return set(range(n_layer - k, n_layer))
