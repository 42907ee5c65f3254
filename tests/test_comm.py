"""Every communication wrapper against numpy, on real ranks, at any world size."""
import numpy as np
import pytest

from hpcpar.comm import Communicator, wait_all

DTYPES = [np.float32, np.float64]
LENGTHS = [1, 7, 1001]


def data(rank, shape, dtype, salt=0):
    """What rank `rank` contributes; every rank can compute every rank's data."""
    return np.random.default_rng([salt, rank]).standard_normal(shape).astype(dtype)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)


@pytest.fixture
def world(comm):
    return Communicator(comm, "world")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_all_reduce(world, dtype, n):
    parts = [data(r, (n, 3), dtype) for r in range(world.size)]
    np.testing.assert_allclose(world.all_reduce(parts[world.rank]), np.sum(parts, 0), **tol(dtype))
    np.testing.assert_allclose(world.all_reduce(parts[world.rank], op="max"), np.max(parts, 0))
    x = parts[world.rank].copy()
    assert world.all_reduce_(x) is x
    np.testing.assert_allclose(x, np.sum(parts, 0), **tol(dtype))
    y = parts[world.rank].copy()
    wait_all([world.iall_reduce_(y)])
    np.testing.assert_allclose(y, np.sum(parts, 0), **tol(dtype))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_all_gather_along_any_axis(world, dtype, axis):
    parts = [data(r, (3, 5, 2), dtype) for r in range(world.size)]
    got = world.all_gather(parts[world.rank], axis=axis)
    np.testing.assert_array_equal(got, np.concatenate(parts, axis=axis))


@pytest.mark.mpi(min_size=1)
def test_all_gather_into_a_reused_output(world):
    parts = [data(r, (3, 5), np.float32) for r in range(world.size)]
    out = np.full((3 * world.size, 5), np.nan, np.float32)
    for _ in range(2):                                       # the same buffer, twice
        assert world.all_gather(parts[world.rank], out=out) is out
        np.testing.assert_array_equal(out, np.concatenate(parts))
    flat = np.empty(out.size, np.float32)                    # any shape of the right size: C order
    np.testing.assert_array_equal(world.all_gather(parts[world.rank], out=flat), np.concatenate(parts).ravel())
    with pytest.raises(ValueError, match="out must be a contiguous float32 array"):
        world.all_gather(parts[world.rank], axis=1, out=out)
    with pytest.raises(ValueError, match="out must be a contiguous float32 array"):
        world.all_gather(parts[world.rank], out=out.astype(np.float64))
    with pytest.raises(ValueError, match="out must be a contiguous float32 array"):
        world.all_gather(parts[world.rank], out=out[:-1])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_scatter_along_any_axis(world, dtype, axis):
    shape = [3, 5]
    shape[axis] = 3 * world.size
    parts = [data(r, tuple(shape), dtype) for r in range(world.size)]
    got = world.reduce_scatter(parts[world.rank], axis=axis)
    want = np.split(np.sum(parts, 0), world.size, axis=axis)[world.rank]
    np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.mpi(min_size=2)
def test_reduce_scatter_refuses_indivisible(world):
    with pytest.raises(ValueError, match="not divisible"):
        world.reduce_scatter(np.zeros((world.size + 1, 2)))


@pytest.mark.mpi(min_size=1)
def test_flat_nonblocking_reduce_scatter_and_all_gather(world):
    k = 5
    parts = [data(r, (k * world.size,), np.float64) for r in range(world.size)]
    shard = np.empty(k)
    wait_all([world.ireduce_scatter(parts[world.rank], shard)])
    np.testing.assert_allclose(shard, np.split(np.sum(parts, 0), world.size)[world.rank], rtol=1e-13)
    whole = np.zeros(k * world.size)
    whole[world.rank * k:(world.rank + 1) * k] = shard
    wait_all([world.iall_gather_(whole)])
    np.testing.assert_allclose(whole, np.sum(parts, 0), rtol=1e-13)


@pytest.mark.mpi(min_size=1)
def test_outputs_the_caller_keeps(world):
    """all_reduce and reduce_scatter write into a kept ``out`` (as all_gather does), called twice."""
    parts = [data(r, (2 * world.size, 3), np.float64) for r in range(world.size)]
    total = np.sum(parts, 0)
    reduced, scattered = np.full((2 * world.size, 3), np.nan), np.full((2, 3), np.nan)
    for _ in range(2):
        assert world.all_reduce(parts[world.rank], out=reduced) is reduced
        np.testing.assert_allclose(reduced, total, rtol=1e-13)
        assert world.reduce_scatter(parts[world.rank], out=scattered) is scattered
        np.testing.assert_allclose(scattered, np.split(total, world.size)[world.rank], rtol=1e-13)
    with pytest.raises(ValueError, match="C-contiguous"):
        world.all_reduce(parts[world.rank], out=np.empty((3, 2 * world.size)).T)
    with pytest.raises(ValueError, match="out must be a contiguous array of 6 elements"):
        world.reduce_scatter(parts[world.rank], out=np.empty((3, 3)))


@pytest.mark.mpi(min_size=2)
def test_bfloat16_travels_as_its_bytes_but_is_never_summed(world):
    """MPI has no bfloat16 datatype: moved as uint16 it arrives bit for bit; a sum is refused."""
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    parts = [data(r, (4, 3), np.float32).astype(bf16) for r in range(world.size)]
    got = world.all_gather(parts[world.rank])
    assert got.dtype == bf16
    np.testing.assert_array_equal(got.view(np.uint16), np.concatenate(parts).view(np.uint16))
    with pytest.raises(TypeError, match="cannot reduce bfloat16"):
        world.all_reduce(parts[world.rank])
    with pytest.raises(TypeError, match="cannot reduce bfloat16"):
        world.all_reduce(parts[world.rank], out=np.empty((4, 3), np.float32))


@pytest.mark.mpi(min_size=2)
def test_host_arrays_of_a_subclass_go_to_mpi_as_they_are(world):
    """An ndarray subclass (np.memmap, np.matrix, ...) is host memory: never mistaken for a device array."""
    class Tagged(np.ndarray):
        pass
    parts = [data(r, (5,), np.float64) for r in range(world.size)]
    np.testing.assert_allclose(world.all_reduce(parts[world.rank].view(Tagged)), np.sum(parts, 0), rtol=1e-13)
    np.testing.assert_array_equal(world.all_gather(parts[world.rank].view(Tagged)), np.concatenate(parts))


@pytest.mark.mpi(min_size=1)
def test_non_contiguous_inputs_are_copied_and_targets_refused(world):
    parts = [data(r, (6, 4), np.float64) for r in range(world.size)]
    view = parts[world.rank][:, ::2]            # strided: not C-contiguous
    assert not view.flags.c_contiguous
    got = world.all_reduce(view)
    np.testing.assert_allclose(got, np.sum(parts, 0)[:, ::2], rtol=1e-13)
    np.testing.assert_array_equal(world.all_gather(view.T, axis=1),
                                  np.concatenate([p[:, ::2].T for p in parts], axis=1))
    if world.size > 1:
        assert world.stats.calls["copy"] >= 1
        with pytest.raises(ValueError, match="C-contiguous"):
            world.all_reduce_(view)
        with pytest.raises(ValueError, match="C-contiguous"):
            world.irecv_(view, source=0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bcast(world, dtype):
    root = world.size - 1
    x = data(root, (11,), dtype) if world.rank == root else np.zeros(11, dtype)
    np.testing.assert_array_equal(world.bcast_(x, root=root), data(root, (11,), dtype))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", DTYPES)
def test_p2p_ring(world, dtype):
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    mine = data(world.rank, (1000,), dtype)
    out = np.empty_like(mine)
    wait_all([world.irecv_(out, left, tag=5), world.isend(mine, right, tag=5)])
    np.testing.assert_array_equal(out, data(left, (1000,), dtype))
    out2 = world.sendrecv(mine, right, np.empty_like(mine), left, tag=6)
    np.testing.assert_array_equal(out2, out)
    # blocking Send/Recv with even/odd ordering (a ring of blocking pairs would deadlock otherwise)
    out3 = np.empty_like(mine)
    if world.rank % 2 == 0:
        world.send(mine, right, tag=8)
        world.recv_(out3, left, tag=8)
    else:
        world.recv_(out3, left, tag=8)
        world.send(mine, right, tag=8)
    np.testing.assert_array_equal(out3, out)


@pytest.mark.mpi(min_size=2)
def test_counters_are_exact(comm):
    c = Communicator(comm, "counted")
    x = np.ones(100, dtype=np.float32)                    # 400 bytes
    c.all_reduce(x)
    c.all_reduce(x)
    c.all_gather(x)
    c.reduce_scatter(np.ones(10 * c.size))                # 80 * size bytes
    right, left = (c.rank + 1) % c.size, (c.rank - 1) % c.size
    c.sendrecv(x, right, np.empty_like(x), left)
    assert dict(c.stats.calls) == {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1,
                                   "send": 1, "recv": 1}
    assert c.stats.bytes["all_reduce"] == 800
    assert c.stats.bytes["all_gather"] == 400
    assert c.stats.bytes["reduce_scatter"] == 80 * c.size
    assert c.stats.total_bytes() == 800 + 400 + 80 * c.size + 800
    c.stats.reset()
    assert c.stats.total_bytes() == 0


@pytest.mark.mpi(min_size=1)
def test_size_one_collectives_are_free(comm):
    solo = Communicator(comm.Split(comm.rank, 0), "solo")
    x = np.arange(4.0)
    assert solo.all_reduce(x) is x and solo.all_gather(x) is x
    assert solo.stats.total_bytes() == 0
    solo.mpi.Free()


@pytest.mark.mpi(min_size=2)
def test_every_call_is_recorded_and_traced(comm):
    """With a flight recorder and a tracer on, every call is one flight entry with its operation, peer
    and payload bytes (the counters' bytes), and every blocking call one "comm" span."""
    from hpcpar.comm import flight
    from hpcpar import tracer as trace
    c = Communicator(comm, "w")
    right, left = (c.rank + 1) % c.size, (c.rank - 1) % c.size
    x, k = np.ones(8), 4 * c.size                            # 64 bytes; k: a block per rank of 4
    rec = flight.install(flight.FlightRecorder(c.rank))
    tracer = trace.start("test")
    try:
        c.all_reduce(x)
        c.all_reduce_(x.copy())
        wait_all([c.iall_reduce_(x.copy())])
        c.all_gather(x)
        c.reduce_scatter(np.ones(k))
        wait_all([c.ireduce_scatter(np.ones(k), np.empty(4))])
        wait_all([c.iall_gather_(np.ones(k))])
        c.bcast_(x.copy())
        c.barrier()
        c.sendrecv(x[:4], right, np.empty(4), left)
        wait_all([c.irecv_(np.empty(2), left), c.isend(x[:2], right)])
        for turn in (c.rank % 2, 1 - c.rank % 2):            # even ranks send first: no deadlock
            c.send(x[:3], right) if turn == 0 else c.recv_(np.empty(3), left)
    finally:
        trace.stop()
        flight.uninstall()
    p2p = [("send", right, 24), ("recv", left, 24)][::1 if c.rank % 2 == 0 else -1]
    assert [(e[flight.OP], e[flight.PEER], e[flight.BYTES]) for e in rec.entries()] == [
        ("all_reduce", None, 64), ("all_reduce", None, 64), ("all_reduce", None, 64), ("all_gather", None, 64),
        ("reduce_scatter", None, 8 * k), ("reduce_scatter", None, 8 * k), ("all_gather", None, 32),
        ("bcast", None, 64), ("barrier", None, 0), ("recv", left, 32), ("recv", left, 16), ("send", right, 16)] + p2p
    assert all(e[flight.END] is not None for e in rec.entries())
    assert [e[0] for e in tracer.events if e[1] == "collective"] == [
        f"w {op}" for op in ("all_reduce", "all_reduce", "all_gather", "reduce_scatter", "bcast", "barrier", "recv")
    ] + [f"w {op}" for op, _, _ in p2p]
    assert c.stats.calls["recv"] == 3 and c.stats.bytes["send"] == 32 + 16 + 24
