"""Skip cleanly without cupy or a CUDA device; count device-to-host copies."""
import pytest


def require_gpu():
    cupy = pytest.importorskip("cupy", reason="the gpu tests need cupy (pip install 'hpcpar[gpu]')")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - any CUDA failure means no usable device
        pytest.skip(f"no usable CUDA device ({err})")
    if n == 0:
        pytest.skip("no CUDA device")
    return cupy


class CopyCounter:
    """Counts every way a cupy array reaches the host: .get(), cupy.asnumpy, float(), .item(), ..."""

    def __init__(self, cupy, monkeypatch):
        self.count = 0
        nd = cupy.ndarray
        for name in ("get", "item", "tolist", "__float__", "__int__", "__bool__", "__array__"):
            original = getattr(nd, name)
            monkeypatch.setattr(nd, name, self._wrap(original))
        monkeypatch.setattr(cupy, "asnumpy", self._wrap(cupy.asnumpy))

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)
        return counted
