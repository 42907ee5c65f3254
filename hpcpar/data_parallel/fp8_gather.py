"""--fp8-param-gather: ZeRO-3 gathers the weights an FP8 recipe quantises per tensor as FP8 codes.

Without it a unit travels in the compute dtype and the forward's GEMM quantises the gathered weight
with the scale of the whole (TP shard of the) weight.  With it each rank quantises its own slice with
that same scale *before* the all-gather and the ranks exchange one byte a number - half of bf16's
bytes, a quarter of fp32's (torchao's enable_fsdp_float8_all_gather; tensorwise only: the scale must
be known before any rank sees the whole weight, and one number is all a slice needs of it).

The scale of a weight is fp8_scale(amax) with amax the maximum over every piece of it: over the
ZeRO group (dp x cp: the slices) and over tensor parallelism (the shards), two small all-reduces at
the start of the step (``Fp8Unit.set_scales``, called by training/low_precision.py for every unit at
once), from the same compute-dtype values the GEMM would quantise.  So the gathered values are
bit for bit those the GEMM's own quantisation gives, and the GEMM takes them as they are
(``Parameter.fp8_scale`` set: fp8/gemm.py does not quantise them again).

The gathered weight is held decoded in the accumulator's dtype (emulation: a GPU keeps the codes);
the working set counts what a GPU holds, the codes' byte a number (``gathered_bytes``), as the one
formula does (zero_memory.gathered_number_bytes).
"""
import numpy as np

from hpcpar import backend
from hpcpar.data_parallel.flat import FlatBuffer
from hpcpar.fp8.formats import E4M3, codes, from_codes, round_to
from hpcpar.fp8.quantise import fp8_scale
from hpcpar.precision import accumulator


class Fp8Unit(FlatBuffer):
    """A ZeRO-3 unit (flat.py's FlatBuffer, gathered) of weights that travel as E4M3 codes."""
    fmt = E4M3

    def __init__(self, params, group, compute_dtype=None, across=None, gathered=True, whole_tensors=False, load=None):
        super().__init__(params, group, compute_dtype, across, gathered, whole_tensors, load)
        self.acc = accumulator(self.compute_dtype)
        self.scales = None                      # (len(params),) fp32: each segment's multiplier s this step
        self.codes = None                       # (size,) uint8 while gathered

    def _pieces(self):
        """(index, start, stop) of each parameter's part of this rank's slice, relative to the slice."""
        for i, (_, a, b) in enumerate(self.segments):
            a, b = max(a, self.lo), min(b, self.hi)
            if a < b:
                yield i, a - self.lo, b - self.lo

    def _values(self):
        """This rank's slice as the GEMM would see it: rounded to the compute dtype, in the accumulator's."""
        return self.master.astype(self.compute_dtype).astype(self.acc)

    def local_amax(self):
        xp = backend.array_module(self.master)
        v, out = self._values(), np.zeros(len(self.segments))
        for i, a, b in self._pieces():
            out[i] = float(xp.abs(v[a:b]).max())
        return out

    def set_scales(self, amax):
        """Each weight's scale from its amax over every rank holding a piece of it."""
        self.scales = fp8_scale(np.asarray(amax), self.fmt)

    def _per_value(self, lo, hi):
        """Each number's scale over flat positions [lo, hi) (the padding: 1)."""
        s = np.ones(hi - lo, dtype=np.float32)
        for i, (_, a, b) in enumerate(self.segments):
            a, b = max(a, lo), min(b, hi)
            if a < b:
                s[a - lo:b - lo] = self.scales[i]
        return s

    def start_gather(self):
        xp = backend.array_module(self.master)
        q = round_to(self.fmt, self._values() * xp.asarray(self._per_value(self.lo, self.hi), dtype=self.acc))
        self.codes = xp.empty(self.size, dtype=np.uint8)
        self.codes[self.lo:self.hi] = xp.asarray(codes(self.fmt, backend.to_numpy(q)))
        self.compute = xp.empty(self.size, dtype=self.acc)      # gathered: decoded when the codes are in
        self.decoded = False
        self.gathering = self.group.iall_gather_(self.codes)

    def finish_gather(self):
        if self.gathering is not None:
            self.gathering.wait()
            self.gathering = None
        if not self.decoded:
            xp = backend.array_module(self.master)
            q = xp.asarray(from_codes(self.fmt, backend.to_numpy(self.codes), self.acc))
            self.compute[...] = q / xp.asarray(self._per_value(0, self.size), dtype=self.acc)
            self.decoded = True
        for i, (p, a, b) in enumerate(self.segments):
            p.data = self.compute[a:b].reshape(p.data.shape)
            p.fp8_scale = float(self.scales[i])

    def free(self):
        super().free()
        self.codes = None
        for p, _, _ in self.segments:
            p.fp8_scale = None

    def gathered_bytes(self):
        return (self.codes.nbytes if self.codes is not None else 0) + (self.grad.nbytes if self.grad is not None else 0)
