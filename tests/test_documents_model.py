"""--documents checked against its definition on one rank: a packed window's loss and gradients are
those of its documents each run alone (the mean over their targets), GPT-2 and Llama, with and without
a sliding window; perturbing a token of one document moves no logit of another, bit for bit (the trl
probe; at cp 2 and 4: test_documents_mpi.py); and a data directory with documents trains where one
written before them still trains as one long document."""
from dataclasses import replace

import numpy as np
import pytest

from hpcpar.data import MarkovLanguage, TokenFile
from hpcpar.data.tokens import starts_file
from hpcpar.nn import GPT, Context
from hpcpar.nn.gpt import preset
from hpcpar.nn.mtp import mtp_targets
from hpcpar.ops.masks import kept_targets

MODELS = {"gpt2": preset("tiny", vocab_size=29, seq_len=16, n_layer=2, d_model=16),
          "llama": preset("llama-tiny", vocab_size=29, seq_len=16, n_layer=2, n_head=4, n_kv_head=2, d_model=16,
                          d_ff=24),
          "deepseek-mtp": preset("deepseek-tiny", vocab_size=29, seq_len=16, n_layer=2, mtp_depth=2, mtp_lambda=1.0)}


def packed_window(batch=3, seed=0):
    data = MarkovLanguage(vocab=29, seq_len=16, doc_len=5, seed=seed)
    x, y = data.batch(0, range(batch))
    return x, y, data.documents(0, range(batch))


def loss_and_grads(model, x, y, ctx):
    for p in model.parameters():
        p.grad[...] = 0
    loss, caches = model.forward(x, ctx, y)
    model.backward(1.0, caches)
    return float(loss), {p.name: p.grad.copy() for p in model.parameters()}


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("arch", list(MODELS))
def test_packed_loss_is_the_mean_of_each_document_run_alone(arch, window):
    if window and MODELS[arch].parts.latent:
        pytest.skip("latent attention has no sliding window (refused)")
    cfg = replace(MODELS[arch], window=window)
    model = GPT(cfg, seed=3, dtype="float64")
    x, y, docs = packed_window()
    keep = kept_targets(docs)
    targets = mtp_targets(y, cfg.mtp_depth, docs) if cfg.mtp_depth else y    # MTP: no shift past a document
    packed, packed_grads = loss_and_grads(model, x, targets, Context(docs=docs[:, :-1], keep=keep))
    alone, alone_grads, pieces = 0.0, None, 0
    for b in range(len(x)):
        for d in np.unique(docs[b, :-1]):
            t = np.flatnonzero(docs[b, :-1] == d)                       # one document's tokens, alone
            y_alone = y[b:b + 1, t]
            if cfg.mtp_depth:                   # its last target ends it: the next document's first token
                y_alone = mtp_targets(y_alone, cfg.mtp_depth, docs[b:b + 1, np.append(t, t[-1] + 1)])
            loss, grads = loss_and_grads(model, x[b:b + 1, t], y_alone, Context(keep=keep[b:b + 1, t]))
            alone += loss
            alone_grads = grads if alone_grads is None else {n: alone_grads[n] + g for n, g in grads.items()}
            pieces += 1
    assert pieces > 2 * len(x) and keep.sum() < keep.size               # several documents, targets left out
    assert packed / keep.sum() == pytest.approx(alone / keep.sum(), rel=1e-12)
    for name, g in packed_grads.items():
        np.testing.assert_allclose(g, alone_grads[name], rtol=1e-10, atol=1e-14, err_msg=name)


def logits(model, x, ctx):
    h = model.embed.forward(x, ctx)[0]
    for block in model.blocks:
        h = block.forward(h, ctx)[0]
    return model.head.forward_cached(h)


@pytest.mark.parametrize("arch", list(MODELS))
def test_a_token_of_one_document_moves_no_logit_of_another(arch):
    model = GPT(MODELS[arch], seed=3, dtype="float64")
    x, _, docs = packed_window(batch=2)
    ctx = Context(docs=docs[:, :-1])
    before = logits(model, x, ctx)
    k = docs[0, 9]
    x[0, 9] = (x[0, 9] + 1) % 29
    after = logits(model, x, ctx)
    other = ctx.docs != k
    other[1:] = True
    np.testing.assert_array_equal(after[other], before[other])
    assert (after[0, 9] != before[0, 9]).all()
    # without the masks the next document's positions all move: the bug the probe finds (trl#6843)
    plain_before, plain_after = logits(model, x, Context()), None
    x[0, 9] = (x[0, 9] + 1) % 29
    plain_after = logits(model, x, Context())
    later = (ctx.docs[0] > k)
    assert (plain_after[0, later] != plain_before[0, later]).all()


def test_positions_restart_at_each_document_of_the_synthetic_language():
    data = MarkovLanguage(vocab=29, seq_len=16, doc_len=4)
    docs = data.documents(5, [0, 1])
    assert docs.shape == (2, 17) and (np.diff(docs, axis=1) >= 0).all() and docs[:, 0].tolist() == [0, 0]
    np.testing.assert_array_equal(data.documents(5, [1]), docs[1:])             # keyed by sample, not call
    plain = MarkovLanguage(vocab=29, seq_len=16)
    assert (plain.documents(0, [0]) == 0).all()
    # a document begins afresh: the language's first-token entropy at each start, in the floor
    assert data.entropy_floor > plain.entropy_floor


def test_an_old_data_directory_trains_as_one_long_document(tmp_path):
    """A directory without train.starts.npy (written before documents were recorded) trains with
    --documents as one long document: the losses of plain causal training; with starts recorded, each
    window gets its documents and the loss changes."""
    from mpi4py import MPI
    from train_helpers import GPT_DIMS, trainer
    (np.random.default_rng(0).integers(0, 29, 400)).astype(np.uint16).tofile(tmp_path / "train.bin")
    assert (TokenFile(tmp_path, seq_len=8, batch_size=2).documents(0, [0, 1]) == 0).all()
    runs = {}
    for name, flags in (("plain", {}), ("old", dict(documents=True)), ("new", dict(documents=True))):
        if name == "new":
            np.save(starts_file(tmp_path / "train.bin"), np.arange(0, 400, 5, dtype=np.int64))
        t = trainer(MPI.COMM_SELF, data=str(tmp_path), dims=dict(GPT_DIMS, layers=2, batch_size=4), **flags)
        runs[name] = [t.step(s).loss for s in range(2)]
        t.grid.free()
    assert runs["old"] == pytest.approx(runs["plain"], rel=1e-12)
    assert runs["new"][0] != pytest.approx(runs["plain"][0], rel=1e-3)
    new = TokenFile(tmp_path, seq_len=8, batch_size=2, order="sequential")
    assert new.documents(0, [0]).tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1]]      # window 0..8, a start at 5


def test_prepare_records_where_each_document_starts(tmp_path):
    """Each file a document, or each piece between separators; each ends with <|endoftext|>, the next
    starts after it; val.bin's first piece is a document of its own."""
    pytest.importorskip("tokenizers")
    from hpcpar.training.text import prepare
    (tmp_path / "a.txt").write_text("the cat sat on the mat. " * 20 + "\n\n\n" + "a dog ran far away. " * 20)
    (tmp_path / "b.txt").write_text("birds sing in the morning light. " * 20)
    meta = prepare([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "one", vocab_size=300, progress=False)
    split = prepare([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "three", vocab_size=300, progress=False,
                    separator="\n\n\n")
    assert meta["documents"]["train"] + meta["documents"]["val"] in (2, 3)       # 2 files; val may start mid-one
    assert split["documents"]["train"] == 3 and split["eot"] is not None
    train = np.fromfile(tmp_path / "three" / "train.bin", dtype=np.uint16)
    starts = np.load(starts_file(tmp_path / "three" / "train.bin"))
    assert starts[0] == 0 and (train[starts[1:] - 1] == split["eot"]).all()      # each after an end-of-text
    assert np.load(starts_file(tmp_path / "three" / "val.bin"))[0] == 0


@pytest.mark.parametrize("arch", [a for a in MODELS if not MODELS[a].parts.latent])     # MLA has no window
def test_generation_keeps_only_the_window_and_reads_the_prompts_document(arch):
    """A window of 4: each windowed layer's KV cache holds 4 positions (a ring buffer), and the cached
    forward - a prompt, more of it, then a token at a time - gives the full forward's logits under the
    window.  With a separator, generation reads the prompt's last document only, from position 0."""
    from hpcpar.training.generate import forward_cached, generate, new_cache
    model = GPT(replace(MODELS[arch], window=4, window_layers="0"), seed=3, dtype="float64")
    ids = np.random.default_rng(1).integers(0, 29, size=(2, 16))
    kv = new_cache(model, 2, 16)
    assert [k.shape[2] for k, _ in kv] == [4, 16]                        # layer 0 windowed, layer 1 whole
    pieces = [forward_cached(model, ids[:, :6], kv, 0), forward_cached(model, ids[:, 6:9], kv, 6)]
    pieces += [forward_cached(model, ids[:, n:n + 1], kv, n) for n in range(9, 16)]
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), logits(model, ids, Context()), rtol=1e-12,
                               atol=1e-13)
    alone = generate(model, [5, 6, 7], 6, temperature=0)
    packed = generate(model, [9, 9, 28, 5, 6, 7], 6, temperature=0, separator=28)
    assert packed[3:] == alone and packed[:3] == [9, 9, 28]
    assert generate(model, [9, 9, 28, 5, 6, 7], 6, temperature=0)[6:] != alone[3:]      # the masks matter
    end = alone[4]                                                       # a document ends at its first one
    assert generate(model, [5, 6, 7], 6, temperature=0, separator=end) == alone[:alone.index(end, 3) + 1]


@pytest.mark.parametrize("flags, message", [
    (dict(boundary_targets=True), "--boundary-targets chooses what --documents leaves out"),
    (dict(window_layers="::2"), "--window-layers ::2 chooses the layers of --window"),
    (dict(window=4, window_layers="0,7"), r"--window-layers '0,7' names a layer outside 0 .. 1"),
    (dict(window=4, window_layers="a:b"), "give a slice like ::2"),
    (dict(model="mlp", documents=True), "need a GPT model"),
    (dict(model="llama-tiny", window=4, window_layers="1", export="out"), "with a sliding window in layers 1 has "
                                                                          "no Hugging Face model to write"),
], ids=["boundary-alone", "layers-alone", "layer-outside", "bad-slice", "mlp", "export-some-layers"])
def test_what_documents_and_windows_cannot_do_is_refused_in_one_line(flags, message):
    from hpcpar.runtime import UsageError
    from hpcpar.training.config import TrainConfig, check
    from hpcpar.training.models import model_config
    with pytest.raises(UsageError, match=message) as err:
        model_config(check(TrainConfig(progress=False, layers=2, **flags), 1))
    assert "\n" not in str(err.value)


def test_a_bad_starts_file_is_refused_in_one_line(tmp_path):
    from hpcpar.runtime import UsageError
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
    for bad in (np.array([3, 9]), np.array([0, 9, 9]), np.array([0, 200]), np.zeros((2, 2), int)):
        np.save(starts_file(tmp_path / "train.bin"), bad)
        with pytest.raises(UsageError, match="document starts must be increasing token offsets from 0"):
            TokenFile(tmp_path, seq_len=8, batch_size=2)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", list(MODELS))
def test_documents_on_the_device_match_numpy(monkeypatch, arch):
    """The rule's masks and the kept targets built on the host reach the device's arrays (cupy on a GPU,
    else the strict stand-in): the packed window's loss and gradients of numpy, to 1e-10."""
    from gpu_helpers import device_module
    from hpcpar import backend
    cupy = device_module(monkeypatch)
    x, y, docs = packed_window()
    ctx = Context(docs=docs[:, :-1], keep=kept_targets(docs))
    cfg = replace(MODELS[arch], window=0 if MODELS[arch].parts.latent else 3)
    y = mtp_targets(y, cfg.mtp_depth, docs) if cfg.mtp_depth else y
    runs = []
    try:
        for name, xp in (("numpy", np), ("cupy", cupy)):
            backend.use(name)
            model = GPT(cfg, seed=3, dtype="float64")
            loss, grads = loss_and_grads(model, xp.asarray(x), xp.asarray(y), ctx)
            runs.append((loss, {n: backend.to_numpy(g) for n, g in grads.items()}))
    finally:
        backend.use("numpy")
    (want, want_grads), (got, got_grads) = runs
    assert got == pytest.approx(want, rel=1e-10)
    for n, g in want_grads.items():
        np.testing.assert_allclose(got_grads[n], g, rtol=1e-10, atol=1e-14, err_msg=n)
