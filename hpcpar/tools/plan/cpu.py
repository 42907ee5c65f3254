"""hpcpar's own engine on a CPU rank: what one pass of numpy work costs, fitted to probes of the engine.

On a GPU the planner counts FLOPs and bytes (compute.py).  A numpy rank is not that simple: every
element-wise op is a separate pass with temporaries, LayerNorm and softmax take several passes, each
numpy call costs microseconds of Python, and fresh memory costs a page fault per 4 KiB (probe.py).  So
the element-wise part is fitted, by kind of tensor, to timed steps of the engine itself.

One pass - forward (F) or backward (B) - of one micro-batch of b sequences of s tokens (N = b*s) through
a stage of n blocks (width h, a heads, MLP width f, vocabulary V) on one of t tensor-parallel ranks:

    time = GEMM FLOPs / R                          flops.py: layer_gemms (+ logits_gemm on the last
                                                   stage), twice in backward; R the best numpy matmul
                                                   rate on one thread; the attention core's share c
                                                   of them, c = ops/attention.causal_work(s)
         + rep   * n N h                           the residual stream (LayerNorms, residual adds,
                                                   row-parallel biases): the same on every TP rank
         + split * n N (4h + f) / t                the activations TP splits: QKV 3h, attention output
                                                   h, MLP hidden f (bias adds, head copies, GELU)
         + soft  * (n N a s c / t  +  [last] N V / t)  elements through a softmax: the attention
                                                   scores its causal blocks compute (c, as above),
                                                   and the logits on the last stage
         + block * n  +  end * ([first] + [last])  Python and numpy calls: per block, and for the
                                                   embedding and the head

rep, split, soft (seconds per element), block and end (seconds) are fitted for F and for B: non-
negative least squares on the relative error, over probes of a few shapes on one rank and on two
tensor-parallel ranks (the two-rank probes tell replicated from split work), and two probes so small
(b = 1, s = 8, h = 16) that only the fixed costs show.  The rest of a step, outside the actions
(optimizer, gradient norm, zeroing, data, the engine between actions):

    rest = step + microbatch * m + param * parameters on the rank

fitted the same way to the one-rank probes.  Tensor-parallel all-reduces are timed apart (local.py).

Memory reuse.  The probes run one micro-batch at a time per stage, and each forward writes its
activations into fresh pages (probe.py).  With pp > 1 a stage also holds receive buffers that keep
the freed memory in the process, so only its first forward of a step pays for fresh pages; the
later ones reuse memory, and their element-wise terms take ``warm`` times as long (fitted to a
two-stage probe).  Backward frees as it goes and reuses memory either way.
"""
import itertools
from dataclasses import dataclass

import numpy as np

from hpcpar.ops.attention import causal_work
from hpcpar.tools.plan.flops import layer_gemms, logits_gemm

TERMS = ("rep", "split", "soft", "block", "end")
ELEMENTWISE = TERMS[:3]
UNITS = {"rep": 1e-9, "split": 1e-9, "soft": 1e-9, "block": 1e-6, "end": 1e-6}    # ns, ns, ns, us, us
REST = ("step", "microbatch", "param")
REST_UNITS = {"step": 1e-3, "microbatch": 1e-3, "param": 1e-9}          # ms, ms, ns


@dataclass(frozen=True)
class Pass:
    """What one pass works on: the stage's blocks and ends, the micro-batch, the TP split."""
    model: object          # hpcpar.shape.ModelShape
    seq_len: int
    mb: int                # sequences per micro-batch
    blocks: int            # blocks on this stage (chunk)
    tp: int = 1
    first: bool = True     # holds the embedding
    last: bool = True      # holds the head (logits and loss)

    def gemm_flops(self):
        """Forward GEMM FLOPs (backward: twice)."""
        core = causal_work(self.seq_len)         # the engine's causal blocks: ops/attention.py
        fl = self.blocks * sum(g.flops * (1 if g.weight else core)
                               for g in layer_gemms(self.model, self.mb, self.seq_len, self.tp))
        return fl + (logits_gemm(self.model, self.mb, self.seq_len, self.tp).flops if self.last else 0)

    def units(self):
        """Elements (and blocks) of each kind of work, as in the module docstring."""
        m, t, n = self.model, self.tp, self.blocks
        tokens = self.mb * self.seq_len
        return {"rep": n * tokens * m.hidden,
                "split": n * tokens * (4 * m.hidden + m.ffn) / t,
                "soft": n * tokens * m.heads * self.seq_len * causal_work(self.seq_len) / t
                        + (tokens * m.vocab / t if self.last else 0),
                "block": n, "end": self.first + self.last}


@dataclass(frozen=True)
class CpuCosts:
    """The fitted constants of one dtype (seconds): a profile's [engine.<dtype>] table."""
    gemm_rate: float       # FLOP/s
    forward: dict          # term -> seconds per unit
    backward: dict
    rest: dict             # step, microbatch, param -> seconds
    warm: float = 1.0      # element-wise forward time when reusing memory / with fresh pages

    def pass_terms(self, p, backward=False, reused=0.0):
        """{term: seconds} of one pass; "GEMM" is FLOPs / R.  ``reused``: the share of forwards that
        reuse memory (module docstring), shown as its own (negative) term."""
        coef = self.backward if backward else self.forward
        terms = {"GEMM": (2 if backward else 1) * p.gemm_flops() / self.gemm_rate}
        terms.update({k: coef[k] * v for k, v in p.units().items()})
        if not backward and reused:
            terms["memory reused"] = -reused * (1 - self.warm) * sum(terms[k] for k in ELEMENTWISE)
        return terms

    def rest_seconds(self, microbatches, params):
        r = self.rest
        return r["step"] + r["microbatch"] * microbatches + r["param"] * params

    @classmethod
    def from_table(cls, table):
        def per_pass(i):
            return {k: table[f"{k}_{_suffix(k)}"][i] * UNITS[k] for k in TERMS}
        return cls(table["gemm_gflops"] * 1e9, per_pass(0), per_pass(1),
                   {k: table[f"{k}_{_rest_suffix(k)}"] * REST_UNITS[k] for k in REST}, table["warm"])

    def table_lines(self):
        """The TOML lines of this dtype's table (forward, backward pairs)."""
        lines = [f"gemm_gflops = {self.gemm_rate / 1e9:.1f}"]
        for k in TERMS:
            lines.append(f"{k}_{_suffix(k)} = [{self.forward[k] / UNITS[k]:.4g}, {self.backward[k] / UNITS[k]:.4g}]")
        lines += [f"{k}_{_rest_suffix(k)} = {self.rest[k] / REST_UNITS[k]:.4g}" for k in REST]
        return lines + [f"warm = {self.warm:.3f}"]


def _suffix(term):
    return "us" if term in ("block", "end") else "ns"


def _rest_suffix(term):
    return "ns" if term == "param" else "ms"


def nnls(A, b):
    """Non-negative c minimising |A c - b|^2.  With at most five unknowns, trying every subset of them
    (plain least squares on each, keeping the best non-negative solution) is exact and short."""
    A, b = np.asarray(A, dtype=float), np.asarray(b, dtype=float)
    best, best_err = np.zeros(A.shape[1]), float(b @ b)
    for k in range(1, A.shape[1] + 1):
        for cols in itertools.combinations(range(A.shape[1]), k):
            c = np.linalg.lstsq(A[:, cols], b, rcond=None)[0]
            err = float(np.sum((A[:, cols] @ c - b) ** 2))
            if (c >= 0).all() and err < best_err:
                best_err, best = err, np.zeros(A.shape[1])
                best[list(cols)] = c
    return best


def fit_relative(rows, measured, known=None):
    """c >= 0 minimising the relative error sum(((rows @ c + known) / measured - 1)^2); also the rms
    relative error of the fit.  ``known``: the part already modelled (the GEMMs), or None."""
    y = np.asarray(measured, dtype=float)
    known = np.zeros(len(y)) if known is None else np.asarray(known, dtype=float)
    A = np.asarray(rows, dtype=float) / y[:, None]
    c = nnls(A, 1 - known / y)
    rms = float(np.sqrt(np.mean((A @ c + known / y - 1) ** 2)))
    return c, rms


def fit_warm(costs, p, forward, microbatches):
    """``warm`` from a pipeline probe's mean forward over m micro-batches, the first on fresh pages:
    forward = fixed + E (1 + (m - 1) warm) / m, E the fresh element-wise terms, fixed the GEMMs, blocks
    and ends.  Clipped to [0, 1]."""
    terms = costs.pass_terms(p)
    fresh = sum(terms[k] for k in ELEMENTWISE)
    left = forward - (sum(terms.values()) - fresh)
    return min(1.0, max(0.0, (microbatches * left / fresh - 1) / (microbatches - 1)))


def fit_passes(samples, gemm_rate):
    """samples: [(Pass, F seconds, B seconds)] -> [(forward coefficients, rms), (backward ..., rms)]."""
    rows = [[p.units()[k] for k in TERMS] for p, _, _ in samples]
    out = []
    for i in (0, 1):
        gemm = [(1 + i) * p.gemm_flops() / gemm_rate for p, _, _ in samples]
        c, rms = fit_relative(rows, [s[1 + i] for s in samples], gemm)
        out.append((dict(zip(TERMS, c)), rms))
    return out
