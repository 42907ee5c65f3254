"""The device for the gpu tests: real cupy on a GPU, else the strict stand-in (tests/fake_cupy); and a
count of device-to-host copies that works on both.

``HPCPAR_REAL_GPU=1`` (set by jobs/gpu_check.sh) turns "no usable GPU" into a failure instead of a
quiet fall-back to the stand-in.
"""
import os

import pytest


def real_cupy():
    """The real cupy module if it imports and sees a device, else None."""
    try:
        import cupy
        if getattr(cupy, "__version__", "") == "stand-in":
            return None
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - ImportError or any CUDA failure: no usable device
        return None


def device_module(monkeypatch):
    """cupy on a GPU when there is one; otherwise the stand-in, installed as ``cupy`` for this test."""
    cupy = real_cupy()
    if cupy is not None:
        return cupy
    if os.environ.get("HPCPAR_REAL_GPU") == "1":
        pytest.fail("HPCPAR_REAL_GPU=1, but cupy does not import or sees no CUDA device")
    import fake_cupy
    return fake_cupy.install(monkeypatch)


def is_stand_in(cupy):
    return cupy.__version__ == "stand-in"


class CopyCounter:
    """Counts every way a cupy array reaches the host: .get(), cupy.asnumpy, float(), .item(), ...

    ``count``: copies the code asked for; ``staged``: ``.get(out=buffer)`` into a host buffer of its own,
    which is how the communicator stages device data for an MPI that is not CUDA-aware (counted apart,
    because their number follows the messages, not the step)."""

    def __init__(self, cupy, monkeypatch):
        self.count = self.staged = 0
        nd = cupy.ndarray
        for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__array__"):
            monkeypatch.setattr(nd, name, self._wrap(getattr(nd, name)))
        monkeypatch.setattr(nd, "get", self._wrap_get(nd.get))
        monkeypatch.setattr(cupy, "asnumpy", self._wrap(cupy.asnumpy))

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)
        return counted

    def _wrap_get(self, fn):
        def counted(array, *args, **kwargs):
            if kwargs.get("out") is not None:
                self.staged += 1
            else:
                self.count += 1
            return fn(array, *args, **kwargs)
        return counted
