"""Muon on one rank: Newton-Schulz, the scales, the split of the parameters, and torch.optim.Muon (+ AdamW)
step for step in float64 (the MPI layouts: tests/test_muon_mpi.py)."""
import inspect
import threading

import numpy as np
import pytest

from hpcpar.optim import make_optimizer, state_arrays
from hpcpar.optim.matrices import matrix_split
from hpcpar.optim.muon import matrices, scale
from hpcpar.optim.newton_schulz import gram_axis, newton_schulz, newton_schulz_cut
from hpcpar.runtime import UsageError
from hpcpar.training.config import TrainConfig, check
from reference import need
from train_helpers import GPT_DIMS, LLAMA_DIMS, rel_err


def _random(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (8, 8)])
def test_newton_schulz_takes_singular_values_near_one(shape):
    """U S V^T -> about U V^T: every singular value of the result in [0.6, 1.25], its singular vectors
    those of G (the polynomial acts on S alone)."""
    g = _random(shape)
    o = newton_schulz(g)
    s = np.linalg.svd(o, compute_uv=False)
    assert s.min() > 0.6 and s.max() < 1.25
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    assert rel_err(np.abs(np.diag(u.T @ o @ vt.T)), np.diag(u.T @ o @ vt.T)) < 1e-12    # diagonal, positive
    assert rel_err(newton_schulz(g.T), o.T) < 1e-12                                      # a tall one: transposed


def test_the_cut_iteration_is_the_plain_one_on_whole_matrices():
    """newton_schulz_cut with nothing to sum (one rank) computes newton_schulz, the Gram on either side."""
    gs = [_random((6, 10), 1), _random((10, 6), 2), _random((7, 7), 3)]
    for axes in ([gram_axis(g.shape) for g in gs], [0, 1, 0]):
        for got, g in zip(newton_schulz_cut(gs, axes), gs):
            assert rel_err(got, newton_schulz(g)) < 1e-12


@pytest.mark.parametrize("axis", [0, 1])
def test_a_cut_matrix_sums_its_pieces_grams(axis):
    """Two 'ranks' (threads) hold halves of one matrix cut along ``axis`` and sum their partial Grams at
    each iteration: together they hold the whole matrix's result."""
    g = _random((6, 10), 4)
    pieces = np.split(g, 2, axis=axis)
    sums = _Pair()
    out = [None, None]

    def rank(r):
        out[r] = newton_schulz_cut([pieces[r]], [axis], lambda v: sums.total(r, v))[0]
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert rel_err(np.concatenate(out, axis=axis), newton_schulz(g)) < 1e-12


class _Pair:
    """An all-reduce of two threads: each hands its array, both get the sum."""

    def __init__(self):
        self.barrier, self.parts = threading.Barrier(2), [None, None]

    def total(self, r, v):
        self.parts[r] = v
        self.barrier.wait()
        out = self.parts[0] + self.parts[1]
        self.barrier.wait()
        return out


def test_bf16_iterations_follow_pytorch():
    """--ns-bf16: products in fp32, rounded to bf16 after each, as PyTorch's bf16 iteration: close (bf16's
    resolution is 2^-8), not equal."""
    torch = need("torch")
    from torch.optim._muon import _zeropower_via_newtonschulz
    from hpcpar.precision import bfloat16
    g = _random((16, 40), 5)
    ours = newton_schulz(g.astype(np.float32), dtype=bfloat16(np)).astype(np.float64)
    theirs = _zeropower_via_newtonschulz(torch.tensor(g, dtype=torch.float32), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    assert rel_err(ours, theirs.double().numpy()) < 3e-2
    assert rel_err(ours, newton_schulz(g)) < 5e-2


def test_scales_and_state_arrays():
    assert scale(768, 3072) == pytest.approx(0.2 * np.sqrt(3072))           # moonlight: AdamW's update RMS
    assert scale(3072, 768, "keller") == 2.0 and scale(768, 3072, "keller") == 1.0
    assert state_arrays("muon", matrix=True) == 1 and state_arrays("muon") == 2 == state_arrays("adamw")


def test_fused_qkv_is_three_matrices():
    """GPT-2's c_attn [Q | K | V] is orthogonalised as Q, K and V apart (each its own singular values near 1),
    which is not the fused matrix orthogonalised whole."""
    from hpcpar.nn import GPT
    from hpcpar.nn.gpt import preset
    from hpcpar.optim.muon import orthogonalise_whole, NewtonSchulz
    p = GPT(preset("tiny", vocab_size=11), 0, np.float64).blocks[0].attn.c_attn.weight
    assert p.matrix and p.fused == 3 and len(matrices(p, p.data)) == 3
    o = orthogonalise_whole(p, _random(p.data.shape, 6), NewtonSchulz())
    for m in matrices(p, o):
        s = np.linalg.svd(m, compute_uv=False)
        assert np.median(s) > 0.6 and s.max() < 1.25       # (a square one's smallest take more steps)
    assert rel_err(o, newton_schulz(_random(p.data.shape, 6))) > 0.1


def test_which_parameters_muon_takes():
    """The blocks' matrices (experts one by one, the shared expert's), not the embeddings, head, norms,
    biases or router."""
    from hpcpar.nn import GPT
    from hpcpar.nn.gpt import preset
    m = GPT(preset("mixtral-tiny", vocab_size=11, n_shared_expert=1), 0, np.float64)
    taken = {p.name for p in m.parameters() if p.matrix}
    assert "layers.0.mlp.experts.gate_up_proj" in taken and "layers.0.self_attn.q_proj.weight" in taken
    assert "layers.0.mlp.shared_experts.down_proj.weight" in taken
    assert not taken & {"embed_tokens.weight", "lm_head.weight", "layers.0.mlp.gate.weight", "norm.weight"}
    experts = next(p for p in m.parameters() if p.name == "layers.0.mlp.experts.gate_up_proj")
    assert len(matrices(experts, experts.data)) == 2 * 4                 # 4 experts x [gate | up]


def test_refused_in_one_line():
    with pytest.raises(UsageError, match="needs --optimizer muon"):
        check(TrainConfig(ns_steps=3), 1)
    with pytest.raises(UsageError, match="--momentum must be in"):
        check(TrainConfig(optimizer="muon", momentum=1.5), 1)
    with pytest.raises(UsageError, match="unknown optimizer"):
        make_optimizer("lion", 1e-3)
    with pytest.raises(UsageError, match="--qk-clip needs a GPT"):
        check(TrainConfig(model="mlp", qk_clip=1.0), 1)
    with pytest.raises(UsageError, match="keeps each matrix whole"):
        check(TrainConfig(optimizer="muon", zero=1, dp=2, memory_budget=1.0), 2)
    from hpcpar.training.models import model_config
    with pytest.raises(UsageError, match="QK-norm normalises"):
        model_config(check(TrainConfig(model="qwen3-moe-tiny", qk_clip=1.0), 1))
    assert check(TrainConfig(optimizer="muon"), 1).momentum == 0.95
    assert check(TrainConfig(optimizer="sgd"), 1).momentum == 0.9
    assert check(TrainConfig(optimizer="muon", zero=1, dp=2), 2).whole_tensors     # each matrix on one owner


def _torch_muon_in(torch, monkeypatch, dtype_cast):
    """torch.optim.Muon whose iteration runs in the working dtype instead of its bf16 cast (the one
    line replaced; the rest is PyTorch's own code)."""
    import torch.optim._muon as muon
    source = inspect.getsource(muon._zeropower_via_newtonschulz)
    assert "grad.bfloat16()" in source
    space = dict(vars(muon))
    exec(source.replace("grad.bfloat16()", dtype_cast), space)
    monkeypatch.setattr(muon, "_zeropower_via_newtonschulz", space["_zeropower_via_newtonschulz"])
    return muon.Muon


@pytest.mark.parametrize("dims,kind", [(GPT_DIMS, "moonlight"), (dict(LLAMA_DIMS, model="mixtral-tiny"), "keller")])
def test_muon_is_torch_optim_muon_plus_adamw(dims, kind, monkeypatch):
    """Four steps of a float64 model: after each, every parameter equals the one PyTorch's Muon (on each
    matrix, nn.Linear's (out, in), Q, K, V and every expert apart) and AdamW (on the rest, decay as
    ours) make of the same gradients, to 1e-10."""
    torch = need("torch")
    Muon = _torch_muon_in(torch, monkeypatch, "grad.clone()")
    from hpcpar.training.step import Trainer
    from mpi4py import MPI
    cfg = TrainConfig(**dict(dims, layers=2), optimizer="muon", muon_scale=kind, dtype="float64", progress=False,
                      warmup=0, lr=2e-2, seed=3, grad_clip=0.0, steps=4)
    t = Trainer(cfg, MPI.COMM_SELF)
    params = t.parameters()
    torch_of = {}                            # name -> its torch tensors, one a matrix
    for p in params:
        pieces = matrices(p, p.data) if p.matrix else [p.data]
        torch_of[p.name] = [torch.tensor(m.T.copy() if p.matrix else m.copy(), requires_grad=True) for m in pieces]
    muon = Muon([x for p in params if p.matrix for x in torch_of[p.name]], lr=cfg.lr, weight_decay=cfg.weight_decay,
                momentum=0.95, adjust_lr_fn="match_rms_adamw" if kind == "moonlight" else "original")
    adamw = torch.optim.AdamW([{"params": [x for p in params if not p.matrix and p.decay for x in torch_of[p.name]]},
                               {"params": [x for p in params if not p.matrix and not p.decay for x in torch_of[p.name]],
                                "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                              weight_decay=cfg.weight_decay)
    for step in range(cfg.steps):
        losses = t.gradients(step)
        for p in params:
            pieces = matrices(p, p.grad) if p.matrix else [p.grad]
            for x, g in zip(torch_of[p.name], pieces):
                x.grad = torch.tensor(g.T.copy() if p.matrix else g.copy())
        result = t.update(step, losses)
        for opt in (muon, adamw):
            for group in opt.param_groups:
                group["lr"] = result.lr
            opt.step()
        for p in params:
            pieces = matrices(p, p.data) if p.matrix else [p.data]
            for x, ours in zip(torch_of[p.name], pieces):
                want = x.detach().numpy()
                err = rel_err(ours, want.T if p.matrix else want)
                assert err < 1e-10, f"step {step}: {p.name} differs from PyTorch by {err:.1e}"


def test_muon_resumes_bit_for_bit(tmp_path):
    """Save after two steps, load into a fresh trainer: the next two losses are the straight run's, bit
    for bit; the checkpoint holds a momentum for each matrix and AdamW's moments for the rest only."""
    from mpi4py import MPI
    from hpcpar.checkpoint import load_checkpoint, save_checkpoint
    from hpcpar.checkpoint.load import CheckpointReader, latest_checkpoint
    from train_helpers import trainer
    kw = dict(dims=dict(GPT_DIMS, layers=2), optimizer="muon", lr=2e-2)
    straight = trainer(MPI.COMM_SELF, **kw)
    want = [straight.step(s).loss for s in range(4)]
    first = trainer(MPI.COMM_SELF, **kw)
    for s in range(2):
        first.step(s)
    save_checkpoint(first, tmp_path, 2)
    second = trainer(MPI.COMM_SELF, **kw)
    assert load_checkpoint(second, tmp_path) == 2
    assert [second.step(s).loss for s in range(2, 4)] == want[2:]
    names = CheckpointReader(latest_checkpoint(tmp_path)).manifest["tensors"]
    keys = set()
    for f in (tmp_path / "step-00000002").glob("*.safetensors"):
        from safetensors import safe_open
        keys |= set(safe_open(str(f), framework="np").keys())
    assert "optimizer/momentum_buffer/h.0.attn.c_attn.weight" in keys and "optimizer/exp_avg/wte.weight" in keys
    assert "optimizer/exp_avg/h.0.attn.c_attn.weight" not in keys and names


@pytest.mark.parametrize("dims", [GPT_DIMS, dict(LLAMA_DIMS, heads=4, kv_heads=2), dict(LLAMA_DIMS, kv_heads=4),
                                  dict(LLAMA_DIMS, model="deepseek-tiny", kv_heads=0)],
                         ids=["gpt2", "llama-gqa", "llama-mha", "deepseek-mla"])
def test_qk_clip_brings_each_head_to_tau(dims):
    """The maxima recorded are the forward's; clipping below them and running the same batch again gives
    every head's largest logit tau exactly (q and k biases scaled too; a shared GQA key, MLA's shared rotary
    key left alone).  One
    layer: a deeper one's inputs change with the clip before it."""
    from mpi4py import MPI
    from train_helpers import trainer
    t = trainer(MPI.COMM_SELF, dims=dict(dims, layers=1), qk_clip=1e9)
    t.gradients(0)
    t.qk_clip.step(t.dp, t.dp.slices(), apply=False)
    before = t.qk_clip.last.copy()
    assert np.isfinite(before).all() and (before > 0).all()
    t.qk_clip.tau = tau = 0.5 * before.min()
    t.gradients(0)                                        # the same batch, the same maxima
    t.qk_clip.step(t.dp, t.dp.slices())
    assert rel_err(t.qk_clip.last, before) < 1e-12
    t.dp.gather_params()
    t.dp.zero_grad()
    t.gradients(0)
    t.qk_clip.step(t.dp, t.dp.slices(), apply=False)
    assert rel_err(t.qk_clip.last, np.full_like(before, tau)) < 1e-12


@pytest.mark.parametrize("name, extra", [("tiny", {}), ("llama-tiny", {}), ("moe-tiny", dict(n_shared_expert=1)),
                                         ("mixtral-tiny", dict(n_shared_expert=2)),
                                         ("deepseek-tiny", dict(first_dense=0))])
def test_the_shapes_matrices_are_the_engines(name, extra):
    """optim/matrices.py's block_matrices - what the planner counts - are the arrays the engine flags for Muon
    (experts' biases not among them)."""
    from hpcpar.nn import GPT
    from hpcpar.nn.gpt import preset
    cfg = preset(name, vocab_size=11, **extra)
    engine = sum(p.data.size for p in GPT(cfg, 0, np.float64).parameters() if p.matrix)
    assert engine == cfg.n_layer * sum(matrix_split(cfg.shape, 1, 1))


def test_whole_tensors_balance_the_group_not_each_buffer():
    """Each buffer's longest to the least loaded rank of the group: a load carried from buffer to buffer
    spreads two buffers' big matrices over two ranks, where buffer by buffer both went to rank 0."""
    from hpcpar.data_parallel.flat import owners
    assert owners([100, 10], 2) == owners([100, 10], 2) == [0, 1]
    load = [0, 0]
    assert owners([100, 10], 2, load) == [0, 1] and owners([100, 10], 2, load) == [1, 0] and load == [110, 110]
