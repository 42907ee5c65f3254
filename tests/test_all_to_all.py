"""all_to_all and all_to_allv on real ranks: contents against a reference every rank can compute, the
payload counted, and one flight entry and one trace span per call (hpcpar/comm/communicator.py)."""
import numpy as np
import pytest

from hpcpar.comm import Communicator


def block(src, dst, shape, dtype):
    """What rank ``src`` sends rank ``dst``: every rank can compute every rank's blocks."""
    return np.random.default_rng([src, dst]).standard_normal(shape).astype(dtype)


def rows(src, dst, size):
    """How many rows rank ``src`` sends rank ``dst`` in the uneven exchange: 0 to size, some zero."""
    return (3 * src + 5 * dst) % (size + 1)


@pytest.fixture
def world(comm):
    return Communicator(comm, "world")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_all_to_all_transposes_blocks(world, dtype):
    n, me = world.size, world.rank
    x = np.concatenate([block(me, j, (2, 3), dtype) for j in range(n)])
    want = np.concatenate([block(i, me, (2, 3), dtype) for i in range(n)])
    np.testing.assert_array_equal(world.all_to_all(x), want)
    out = np.empty_like(x)
    assert world.all_to_all(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    wide = np.concatenate([x, x], axis=1)[:, :3]                         # strided: copied, still right
    np.testing.assert_array_equal(world.all_to_all(wide), want)
    if n > 1:
        assert world.stats.bytes["all_to_all"] == 3 * x.nbytes and world.stats.bytes["copy"] == x.nbytes
        with pytest.raises(ValueError, match="not divisible"):
            world.all_to_all(np.ones(n + 1))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("given", [False, True])
def test_all_to_allv_moves_uneven_rows(world, given):
    n, me = world.size, world.rank
    send = [rows(me, j, n) for j in range(n)]
    recv = [rows(i, me, n) for i in range(n)]
    x = np.concatenate([block(me, j, (send[j], 4), np.float64) for j in range(n)])
    want = np.concatenate([block(i, me, (recv[i], 4), np.float64) for i in range(n)])
    y = world.all_to_allv(x, send, recv if given else None)
    np.testing.assert_array_equal(y, want)
    out = np.empty_like(want)
    assert world.all_to_allv(x, send, recv, out=out) is out
    np.testing.assert_array_equal(out, want)
    if n > 1:
        assert world.stats.calls["all_to_allv"] == 2 and world.stats.bytes["all_to_allv"] == 2 * x.nbytes
        # unknown receive counts cost one all_to_all of the counts: one int64 per rank
        assert world.stats.bytes["all_to_all"] == (0 if given else 8 * n)
    with pytest.raises(ValueError, match="send_counts"):
        world.all_to_allv(x, send[:-1] + [send[-1] + 1], recv)


@pytest.mark.mpi(min_size=2)
def test_all_to_all_is_recorded_and_traced(comm):
    from hpcpar.comm import flight
    from hpcpar import tracer as trace
    c = Communicator(comm, "w")
    n = c.size
    rec = flight.install(flight.FlightRecorder(c.rank))
    tracer = trace.start("test")
    try:
        c.all_to_all(np.ones((n, 2)))
        c.all_to_allv(np.ones((n, 3)), [1] * n)
    finally:
        trace.stop()
        flight.uninstall()
    assert [(e[flight.OP], e[flight.SEQ], e[flight.PEER], e[flight.BYTES]) for e in rec.entries()] == [
        ("all_to_all", 1, None, 16 * n), ("all_to_all", 2, None, 8 * n), ("all_to_allv", 3, None, 24 * n)]
    assert all(e[flight.END] is not None for e in rec.entries())
    assert [e[0] for e in tracer.events if e[1] == "collective"] == ["w all_to_all", "w all_to_all", "w all_to_allv"]
