"""Data parallelism's overlap machinery: buckets cut where the backward reports gradients, and polls
between the backward's GEMMs that move the buckets in flight on - without changing a number."""
import numpy as np
import pytest

import hpcpar.data_parallel.replicas
from hpcpar import inflight
from hpcpar.data_parallel.replicas import cut_buckets
from hpcpar.nn.gpt import GPT, preset
from hpcpar.nn.linear import Linear
from hpcpar.nn.parameter import Parameter
from test_nn import Reports
from train_helpers import free, reference, rel_err, trainer


def params(*sizes):
    return [Parameter(f"p{i}", np.zeros(n)) for i, n in enumerate(sizes)]       # float64: 8 bytes each


def test_a_bucket_never_waits_for_a_later_report():
    """Whole reports share a bucket while they fit; one that does not fit starts a new bucket; a report
    larger than a bucket is cut (between parameters) into several."""
    a, b, c, d, e = params(10, 30, 20, 20), params(10, 20), params(60, 60, 10), params(30), params(10)
    buckets = cut_buckets([a, b, c, d, e], bucket_bytes=8 * 100)
    assert buckets == [a, b, c[:2], c[2:], d + e]


def test_grad_groups_are_what_the_backward_reports():
    model = GPT(preset("tiny", vocab_size=29, seq_len=8, n_layer=2, d_model=16, n_head=2), dtype="float64")
    ids = np.random.default_rng(0).integers(0, 29, (2, 8))
    _, caches = model.forward(ids, targets=ids)
    reported = []
    model.hooks = Reports(reported.append)
    model.backward(1.0, caches, final=True)
    assert reported == [g for g in model.grad_groups() if g]
    assert sorted(id(p) for g in reported for p in g) == sorted(id(p) for p in model.parameters())


def test_a_linear_polls_after_each_backward_gemm():
    """Once the input gradient's GEMM, once the weight gradient's (now, or later when deferred)."""
    lin = Linear("l", 4, 3, 0.02, 0, np.float64)
    x, dy = np.ones((2, 4)), np.ones((2, 3))
    polls = []
    inflight.poll()                                     # nothing installed: nothing happens
    inflight.install(lambda: polls.append(1))
    try:
        lin.backward(dy, x)
        assert len(polls) == 2
        work = []
        lin.backward(dy, x, defer=work)
        assert len(polls) == 3
        for fn in work:
            fn()
        assert len(polls) == 4
    finally:
        inflight.install(None)


@pytest.mark.mpi(min_size=2)
def test_polls_between_gemms_change_no_number(comm, monkeypatch):
    """Every poll mode trains the same numbers as one rank; "gemms" tests the buckets in flight more
    often than the backward reports gradients, and uninstalls its poll when the step's buckets are done."""
    calls = []
    test_all = hpcpar.data_parallel.replicas.test_all
    monkeypatch.setattr(hpcpar.data_parallel.replicas, "test_all", lambda requests: calls.append(1) or test_all(requests))
    ref = reference(comm, microbatches=2)
    want = [ref.step(s)[0] for s in range(2)]
    free(ref)
    counts = {}
    for mode in ("gemms", "reports", "off"):
        t = trainer(comm, dp=comm.size, microbatches=2, bucket_mb=0.01)
        t.dp.poll = mode
        calls.clear()
        got = [t.step(s)[0] for s in range(2)]
        counts[mode] = len(calls)
        assert inflight._hook is None
        # float64, the same model summed over another batch split: agreement to rounding, not bits
        assert rel_err(got, want) <= 1e-10, (mode, got, want)
        free(t)
    reports = 2 * (1 + 8 + 1)                            # 2 steps x (head, 8 blocks, embedding)
    assert counts["off"] == 0
    assert counts["reports"] == reports
    assert counts["gemms"] > 2 * reports
