"""Documents and sliding windows on one process (ops/masks.py's rule): the rule as drawn, positions and
targets of a packed window, the blocked attention and the ring against the definition (each document's
attention on its own), the skipped key blocks, and the balance of the ring's work over documents."""
import numpy as np
import pytest

from hpcpar.ops.attention import attention_backward, attention_forward, blocks_work, key_blocks
from hpcpar.ops.masks import Mask, documents_of, kept_targets, restart_positions, windowed_layers
from hpcpar.ops.ring_attention import (balanced_positions, document_balance, rank_work, ring_plan, simulate_ring)
from hpcpar.runtime import UsageError

B, NH, HS = 2, 3, 4
# two windows of 16 tokens: documents [0, 3), [3, 11), [11, 16); and [0, 7), [7, 8), [8, 16)
DOCS = np.array([[0] * 3 + [1] * 8 + [2] * 5, [0] * 7 + [1] + [2] * 8])


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def test_the_rule_as_drawn():
    """The picture of ops/masks.py: documents [0, 3), [3, 8); block-diagonal causal, then banded by W = 2."""
    docs = np.array([[0, 0, 0, 1, 1, 1, 1, 1]])
    seen = Mask(docs).allowed(range(8), range(8))[0]
    assert seen[2].tolist() == [1, 1, 1, 0, 0, 0, 0, 0] and seen[4].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert seen.sum() == 3 * 4 // 2 + 5 * 6 // 2                 # two causal triangles, nothing across
    banded = Mask(docs, window=2).allowed(range(8), range(8))[0]
    assert banded[2].tolist() == [0, 1, 1, 0, 0, 0, 0, 0] and banded[3].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert (Mask().allowed(range(8), range(8))[0] == np.tril(np.ones((8, 8), bool))).all()


def test_positions_targets_and_starts_of_a_packed_window():
    docs = np.array([[4, 4, 5, 5, 5, 6, 6]])
    assert restart_positions(docs).tolist() == [[0, 1, 0, 1, 2, 0, 1]]
    assert kept_targets(docs).tolist() == [[True, False, True, True, False, True]]
    # a stream of documents starting at 0, 5 and 9: the window of 6 tokens from token 3
    assert documents_of(np.array([0, 5, 9]), 3, 8).tolist() == [0, 0, 1, 1, 1, 1, 2, 2]
    assert Mask(docs).keys_seen(7).tolist() == [[1, 2, 1, 2, 3, 1, 2]]
    assert Mask(docs, window=2).keys_seen(7).tolist() == [[1, 2, 1, 2, 2, 1, 2]]


def test_windowed_layers_read_a_slice_or_a_list():
    assert windowed_layers("", 4) == (0, 1, 2, 3)
    assert windowed_layers("::2", 5) == (0, 2, 4)               # gpt-oss alternates, from the first
    assert windowed_layers("2:", 4) == (2, 3)                   # Qwen's max_window_layers = 2
    assert windowed_layers("3,1", 4) == (1, 3)
    for bad in ("x", "::0", "0,9"):
        with pytest.raises(UsageError, match="--window-layers"):
            windowed_layers(bad, 4)


def per_document(q, k, v, docs, window, do):
    """The definition: each document's own causal (windowed) attention, on its tokens alone."""
    o, grads = np.zeros_like(q), [np.zeros_like(q) for _ in range(3)]
    for b in range(q.shape[0]):
        for d in np.unique(docs[b]):
            t = np.flatnonzero(docs[b] == d)
            part = [x[b:b + 1, :, t] for x in (q, k, v)]
            ob, cache = attention_forward(*part, block=len(t), attn_mask=Mask(window=window) if window else None)
            o[b:b + 1, :, t] = ob
            for g, gb in zip(grads, attention_backward(do[b:b + 1, :, t], cache)):
                g[b:b + 1, :, t] = gb
    return o, grads


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("block", [1, 3, 4, 16])
def test_blocked_attention_over_documents_is_each_document_alone(rng, window, block):
    """Forward and backward of the packed window, in query blocks that skip the keys before their
    first document, equal each document's attention run alone (float64, 1e-12)."""
    q, k, v, do = (rng.standard_normal((B, NH, 16, HS)) for _ in range(4))
    o, cache = attention_forward(q, k, v, block=block, attn_mask=Mask(DOCS, window))
    grads = attention_backward(do, cache)
    want_o, want = per_document(q, k, v, DOCS, window, do)
    np.testing.assert_allclose(o, want_o, rtol=1e-12, atol=1e-14)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_query_blocks_skip_the_key_blocks_of_earlier_documents():
    """Blocks of 4 rows over DOCS: a block sees keys from the start of its first row's earliest
    document (over the batch) on; the work counted is what the blocks compute."""
    mask = Mask(DOCS)
    assert key_blocks(16, 4, mask) == [(0, 4, 0), (4, 8, 0), (8, 12, 3), (12, 16, 8)]
    assert blocks_work(16, 4, mask) == (4 * 4 + 4 * 8 + 4 * 9 + 4 * 8, 4 * 4 + 4 * 8 + 4 * 12 + 4 * 16)
    assert key_blocks(16, 4, Mask(DOCS, window=2))[3] == (12, 16, 11)       # the window's edge is later
    assert blocks_work(16, 4) == (160, 160)                                  # plain causal: nothing skipped


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("window", [0, 3])
def test_ring_over_documents_is_the_blocked_attention(rng, cp, window):
    """The ring with skipped and trimmed blocks, on the causal balance and on the documents' deal,
    equals the one-rank attention over the same rule, forward and backward."""
    mask = Mask(DOCS, window)
    q, k, v, do = (rng.standard_normal((B, NH, 16, HS)) for _ in range(4))
    o, cache = attention_forward(q, k, v, block=4, attn_mask=mask)
    want = [o, *attention_backward(do, cache)]
    for positions in ([balanced_positions(16, cp, r) for r in range(cp)], document_balance(16, cp, mask)):
        got = simulate_ring(*([x[:, :, p] for p in positions] for x in (q, k, v)), positions,
                            [do[:, :, p] for p in positions], attn_mask=mask)
        for parts, w in zip(got, want):
            for p, part in zip(positions, parts):
                np.testing.assert_allclose(part, w[:, :, p], rtol=1e-12, atol=1e-14)


def test_document_balance_deals_the_work_no_worse_than_the_causal_balance():
    """Each position on one rank; the busiest rank's work (keys its queries see) at most the causal
    balance's - and below it for a window of one long and many short documents."""
    docs = np.array([[0] * 24 + [1] * 2 + [2] * 2 + [3] * 2 + [4] * 2])              # T = 32
    mask = Mask(docs)
    dealt = document_balance(32, 2, mask)
    assert sorted(np.concatenate(dealt).tolist()) == list(range(32))
    causal = [balanced_positions(32, 2, r) for r in range(2)]
    assert sum(rank_work(dealt, mask)) == sum(rank_work(causal, mask)) == int(mask.keys_seen(32).sum())
    assert max(rank_work(dealt, mask)) < max(rank_work(causal, mask))
    assert rank_work(causal, mask) == [48, 264] and rank_work(dealt, mask) == [164, 148]


def test_ring_plan_skips_the_blocks_of_other_documents():
    """Two ranks, 8 tokens, documents [0, 4) and [4, 8): rank 0 holds positions 0, 1, 6, 7 and rank 1
    positions 2, 3, 4, 5; at step 1 rank 0's queries 0, 1 see rank 1's keys 2, 3 never (keys after
    them), but its queries 6, 7 see keys 4, 5 of their document; rank 1's queries 2, 3 see keys 0, 1
    and its queries 4, 5 nothing of rank 0's block."""
    plan = ring_plan([0, 0, 0, 0, 1, 1, 1, 1], 2)
    assert plan == [[(0, 4, 4), (1, 2, 2)], [(1, 4, 4), (0, 2, 2)]]
    alone = ring_plan([0, 0, 1, 1, 2, 2, 3, 3], 2)       # documents of 2: no block of the other rank is seen
    assert [steps[1] for steps in alone] == [(1, 0, 0), (0, 0, 0)]


def test_the_flop_count_of_a_packed_window_sums_the_rule_over_its_documents():
    """shape.py's closed forms count the pairs ops/masks.py's rule lets through; the FLOP convention's
    span (each document's square) is the sequence for one document; the planner's scores GEMM and the
    engine's step FLOPs charge it."""
    from hpcpar.flops import gpt_step_flops
    from hpcpar.nn.gpt import preset
    from hpcpar.tools.plan.flops import layer_gemms, packed_keys
    from hpcpar.shape import attention_span, visible_pairs
    for lengths, window in (([16], 0), ([3, 8, 5], 0), ([3, 8, 5], 2), ([7, 1, 8], 3), ([16], 5)):
        docs = np.repeat(np.arange(len(lengths)), lengths)[None]
        pairs = int(Mask(docs, window).allowed(range(16), range(16)).sum())
        assert sum(visible_pairs(n, window) for n in lengths) == pairs
        assert attention_span(lengths, window) == (2 * pairs - 16) / 16
    assert attention_span([16]) == 16 and attention_span([4] * 4) == 4
    assert packed_keys(4096, 512, 0) == 512 and packed_keys(4096, 0, 0) == 0
    cfg = preset("tiny", vocab_size=64, seq_len=64)
    scores = [g for g in layer_gemms(cfg.shape, 2, 64, 1, keys=16) if g.name == "scores"][0]
    assert scores.flops == 2 * 64 * 16 * cfg.head_size * 2 * cfg.n_head
    saved = gpt_step_flops(cfg, 128) - gpt_step_flops(cfg, 128, span=16)
    assert saved == 3 * cfg.n_layer * 4 * (64 - 16) * cfg.d_model * 128


def test_the_run_reports_what_the_documents_did_to_attention():
    """The summary's and the profile's figures (training/documents.py): documents per window, keys
    charged, the share of the plain blocks' work computed, the ring's busiest rank over the mean."""
    from hpcpar.nn import Context
    from hpcpar.training.documents import DocumentFigures
    one = DocumentFigures(16, 1, 0, False, 4)
    one.add(Context(docs=DOCS))
    assert (one.windows, one.documents) == (2, 6) and (one.done, one.plain) == (2 * 116, 2 * 160)
    assert one.mean_span() == (3 * 3 + 8 * 8 + 5 * 5 + 7 * 7 + 1 + 8 * 8) / 32
    assert "3.0 per window of 16" in one.line() and "72.5% of the plain causal" in one.work_line()
    ring = DocumentFigures(16, 2, 1, True, 4)
    deal = document_balance(16, 2, Mask(DOCS))
    ring.add(Context(docs=DOCS, cp_positions=deal))
    work = rank_work(deal, Mask(DOCS))
    assert ring.busiest["dealt"] == [max(work) / np.mean(work)] and "busiest cp rank" in ring.line()
