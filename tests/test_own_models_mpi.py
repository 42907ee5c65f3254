"""Real models and real evaluation on real ranks: Hugging Face's GPT-2 and Llama at tp2 x pp2 x dp2 give
transformers' loss, the validation loss is the single-rank one on every layout, and a GPT-2
124M-shaped model goes in and out of a tensor-parallel run without its vocabulary padding."""
import json

import numpy as np
import pytest

from hf_helpers import hf_llama, hf_loss, hf_model, load_hf, save_hf, transformers
from hpcpar.checkpoint.consolidated import export, init_from, read_weights
from train_helpers import free, trainer

HF_DIMS = dict(n_layer=4, n_embd=32, n_head=4, vocab_size=61, n_positions=24)


@pytest.fixture
def shared_dir(comm, tmp_path_factory):
    """One directory every rank sees (rank 0 makes it)."""
    path = str(tmp_path_factory.mktemp("models")) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


def fixed_batch(t, x, y):
    """Make every step's batch (x, y): sample s of the global batch is row s, on every rank."""
    t.data.batch = lambda step, ids: (x[list(ids)], y[list(ids)])


def step_loss(t):
    """Mean loss of step 0's batch over the whole layout (the last stage's TP rank 0 holds the sums)."""
    g = t.grid
    losses = t.gradients(0)
    mine = sum(float(v) for v in losses) if (t.computes_loss and g.tp_rank == 0) else 0.0
    return float(g.world_comm.all_reduce(np.array([mine]))[0]) / t.loss_terms


# Llama: 4 query heads on 2 K/V heads, so tp 2 cuts both
LLAMA_DIMS = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=40, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=61, max_position_embeddings=24)


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hugging_face_model_on_tp2_pp2_dp2_gives_transformers_loss(comm, shared_dir, family):
    if comm.size != 8:
        pytest.skip("a 2 x 2 x 2 layout")
    transformers()                                   # every rank skips together, or none does
    tokens = np.random.default_rng(5).integers(0, HF_DIMS["vocab_size"], size=(8, 13))
    x, y = tokens[:, :-1], tokens[:, 1:]
    want = None
    if comm.rank == 0:
        model = hf_model(**HF_DIMS) if family == "gpt2" else hf_llama(**LLAMA_DIMS)
        save_hf(model, f"{shared_dir}/hf")
        want = hf_loss(model, x, y)
    want = comm.bcast(want, root=0)
    t = trainer(comm, tp=2, pp=2, dp=2, microbatches=2, init_from=f"{shared_dir}/hf", layers=0, hidden=0,
                heads=0, seq_len=12, batch_size=8, model="tiny" if family == "gpt2" else "llama-tiny")
    init_from(t, f"{shared_dir}/hf")
    fixed_batch(t, x, y)
    # transformers and hpcpar on 8 ranks sum in different orders: float64 round-off, not bit-equal
    assert step_loss(t) == pytest.approx(want, rel=1e-10)
    free(t)


def write_tokens(directory, n_train=4000, n_val=600, vocab=40):
    """train.bin / val.bin / meta.json as `hpcpar data prepare` writes them (no tokenizer needed here)."""
    rng = np.random.default_rng(11)
    for name, n in (("train.bin", n_train), ("val.bin", n_val)):
        rng.integers(0, vocab, size=n).astype(np.uint16).tofile(f"{directory}/{name}")
    with open(f"{directory}/meta.json", "w") as f:
        json.dump({"vocab_size": vocab, "dtype": "uint16"}, f)


@pytest.mark.mpi(min_size=8)
def test_validation_loss_is_the_single_rank_one_on_every_layout(comm, shared_dir):
    if comm.size != 8:
        pytest.skip("a 2 x 2 x 2 layout")
    if comm.rank == 0:
        write_tokens(shared_dir)
    comm.barrier()
    from mpi4py import MPI
    common = dict(data=shared_dir, eval_every=1, eval_batches=3)
    one = trainer(MPI.COMM_SELF, **common)
    one.step(0)
    want = one.evaluate(3)
    t = trainer(comm, tp=2, pp=2, dp=2, microbatches=4, sequence_parallel=True, **common)
    t.step(0)
    assert t.mcfg.vocab_size == 40 and t.val_data is not None
    # the same windows, cut over 8 ranks: equal to float64 round-off
    assert t.evaluate(3) == pytest.approx(want, rel=1e-12)
    free(t)
    free(one)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(900)             # ~30 s of CPU (two 124M-parameter ranks), far more on a loaded machine
def test_gpt2_124m_shape_loads_and_exports_through_tensor_parallelism(comm, shared_dir):
    """50257 rows do not split over tp 2: each rank holds 25129 of a zero-padded 50258. The padding must
    neither change the loss nor appear in the export. Random float32 weights, one short batch."""
    if comm.size != 2:
        pytest.skip("tp 2 on 2 ranks")
    transformers()
    src = f"{shared_dir}/gpt2.safetensors"
    if comm.rank == 0:
        from hpcpar.checkpoint.consolidated import write_weights
        from hpcpar.checkpoint.gpt2 import expected_shapes
        from hpcpar.nn.gpt import PRESETS
        rng = np.random.default_rng(0)
        weights = {n: (rng.standard_normal(s, dtype=np.float32) * 0.02) for n, s in expected_shapes(PRESETS["gpt2"]).items()}
        write_weights(weights, src, {"n_head": "12", "layer_norm_epsilon": "1e-05"})
    comm.barrier()
    t = trainer(comm, tp=2, model="gpt2", init_from=src, layers=0, hidden=0, heads=0, seq_len=8, batch_size=2,
                dtype="float32")
    init_from(t, src)
    assert t.mcfg.vocab_size == 50257 and t.mcfg.n_positions == 1024
    tokens = np.random.default_rng(2).integers(0, 50257, size=(2, 9))
    fixed_batch(t, tokens[:, :-1], tokens[:, 1:])
    ours = step_loss(t)
    export(t, f"{shared_dir}/out")
    if comm.rank == 0:
        back, original = read_weights(f"{shared_dir}/out"), read_weights(src)
        assert back["wte.weight"].shape == (50257, 768)
        assert set(back) == set(original)
        for name, w in original.items():
            np.testing.assert_array_equal(back[name], w)          # copied, never computed: bit-equal
        # float32: two implementations of the same sums agree to ~1e-6 relative
        assert hf_loss(load_hf(f"{shared_dir}/out", "float32"), tokens[:, :-1], tokens[:, 1:]) == \
            pytest.approx(ours, rel=1e-5)
    free(t)
