"""YaRN (Peng et al. 2023): rotary frequencies stretched for a context longer than the one trained on, as
DeepSeek-V3 (and Kimi K2) use it and transformers reads it from a config's ``rope_parameters``.

A model trained on ``original_positions`` tokens sees slow rotary pairs (a wavelength longer than the
context) only partly turned; YaRN divides their frequencies by ``factor`` (interpolation: positions
look ``factor`` times closer) and leaves the fast ones as they are (extrapolation), with a linear ramp
between, the ramp's ends where a pair turns ``beta_fast`` and ``beta_slow`` times over the original
context:

    w_i    = theta^(-2i/d)                                  i = 0 .. d/2 - 1, d the rotary width
    dim(n) = d log(L / (2 pi n)) / (2 log theta)           the pair that turns n times in L = original_positions
    lo, hi = floor(dim(beta_fast)), ceil(dim(beta_slow))   clipped to [0, d - 1]
    ramp_i = clip((i - lo) / (hi - lo), 0, 1)               0: fast pairs, 1: slow pairs
    w'_i   = w_i / factor * ramp_i + w_i * (1 - ramp_i)

and two magnitudes, m(s, c) = 0.1 c ln(s) + 1 for s > 1 (else 1):

    attention factor  m(factor, mscale) / m(factor, mscale_all_dim)  (or m(factor) without both): cos and sin
                      are multiplied by it, so the rotary part of every score q . k scales by its square
    softmax scale     MLA's 1 / sqrt(d_qk) times m(factor, mscale_all_dim)^2 (DeepSeek's reference code, and
                      transformers' ``yarn_apply_mscale``): every score, rotary part or not

DeepSeek-V3 ships factor 40, original 4096, beta 32 / 1, mscale = mscale_all_dim = 1: the attention factor
is then 1 and the softmax scale (1 + 0.1 ln 40)^2 = 1.87 times 1/sqrt(192).  Computed in float64 on the host.
"""
import math
from dataclasses import dataclass

import numpy as np


def yarn_magnitude(scale, mscale=1.0):
    """m(s, c) = 0.1 c ln(s) + 1 (1 for s <= 1): YaRN's eq. 21."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class Yarn:
    factor: float                   # how much longer the context is than the trained one
    original_positions: int         # the context the model was trained on (original_max_position_embeddings)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0             # 0: not given
    mscale_all_dim: float = 0.0     # 0: not given (then no change to the softmax scale)
    attention_factor: float = 0.0   # 0: from factor, mscale and mscale_all_dim
    truncate: bool = True           # the ramp's ends rounded outward to whole pairs

    def inv_freq(self, dim, theta):
        """The d/2 frequencies w'_i (float64) of a rotary width ``dim``."""
        w = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)            # (d/2,)

        def turns(n):
            return dim * math.log(self.original_positions / (n * 2 * math.pi)) / (2 * math.log(theta))
        lo, hi = turns(self.beta_fast), turns(self.beta_slow)
        if self.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        hi = hi + 0.001 if lo == hi else hi                  # no division by zero (transformers' guard)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
        return w / self.factor * ramp + w * (1.0 - ramp)

    def cos_sin_scale(self):
        """The attention factor: what cos and sin are multiplied by."""
        if self.attention_factor:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_magnitude(self.factor, self.mscale) / yarn_magnitude(self.factor, self.mscale_all_dim)
        return yarn_magnitude(self.factor)

    def softmax_scale(self):
        """What multiplies MLA's 1 / sqrt(d_qk): m(factor, mscale_all_dim)^2, or 1."""
        return yarn_magnitude(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0
