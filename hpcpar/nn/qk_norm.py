"""QK-norm as a module (Qwen3's q_norm and k_norm, ops/qk_norm.py): the two gains over a head's HS
features, applied to the query and key heads of a Llama attention.  Like RMSNorm it computes in fp32
under a low precision and rounds its outputs once."""
from hpcpar.nn.module import Module, run_or_defer
from hpcpar.nn.parameter import Parameter, init_full
from hpcpar.ops.qk_norm import qk_norm_backward_input, qk_norm_backward_weight, qk_norm_forward
from hpcpar.precision import to_fp32


class QKNorm(Module):
    def __init__(self, prefix, head_size, seed, dtype, eps=1e-6):
        self.q_norm, self.k_norm = (Parameter(n, init_full(n, (head_size,), "ones", seed, dtype))
                                    for n in (f"{prefix}.q_norm.weight", f"{prefix}.k_norm.weight"))
        self.eps = eps

    def forward(self, q, k):
        """q (B, nh, T, HS), k (B, nkv, T, HS) -> the same, normalised per head; the cache"""
        qn, kn, cache = qk_norm_forward(to_fp32(q), to_fp32(k), to_fp32(self.q_norm.data),
                                        to_fp32(self.k_norm.data), self.eps)
        return qn.astype(q.dtype, copy=False), kn.astype(k.dtype, copy=False), cache

    def backward(self, dq, dk, cache, defer=None):
        dq32, dk32 = to_fp32(dq), to_fp32(dk)

        def weight_grads():
            dg_q, dg_k = qk_norm_backward_weight(dq32, dk32, cache)
            self.q_norm.grad += dg_q
            self.k_norm.grad += dg_k
        run_or_defer(weight_grads, defer)
        dq_in, dk_in = qk_norm_backward_input(dq32, dk32, to_fp32(self.q_norm.data), to_fp32(self.k_norm.data), cache)
        return dq_in.astype(dq.dtype, copy=False), dk_in.astype(dk.dtype, copy=False)
