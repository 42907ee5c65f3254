"""A strict CuPy stand-in for machines without a GPU: "device" arrays that are numpy arrays inside.

Tests install it as ``cupy`` (and ``cupyx``) in sys.modules when the real cupy is absent (see
``install``), so the engine's GPU code runs in every ``make test``.  It implements the part of CuPy that
hpcpar uses, each array method and function by delegating to numpy on the wrapped array and wrapping
the result again.  What makes it useful is what it refuses and what it counts, rule by rule as CuPy:

* ``np.asarray(d)``, ``np.array(d)`` (``__array__``): TypeError, CuPy's "Implicit conversion to a NumPy
  array is not allowed" - a device array never becomes a host array by accident.
* a numpy array in an operation with a device array (``d + h``, ``h * d``, ``cupy.matmul(d, h)``):
  TypeError, as CuPy's "Unsupported type <class 'numpy.ndarray'>"; assigned to a slice (``d[2:5] = h``):
  refused, as CuPy's "non-scalar numpy.ndarray cannot be used for fill".  Python and numpy scalars are
  fine, as in CuPy.  Stricter than CuPy: a numpy array as an *index*, or assigned through one, is
  refused too (CuPy copies it to the device silently, once per call - exactly the hidden copy these
  tests look for).
* ``float(d)``, ``int(d)``, ``bool(d)``, ``d.item()``, ``d.tolist()``: allowed, as in CuPy (which
  synchronises and copies), and each counted as an *implicit* device-to-host copy.
* ``d.get()``, ``d.get(out=h)``, ``cupy.asnumpy(d)``: explicit device-to-host copies, counted (into a
  pinned buffer from ``cupyx.empty_pinned``: counted as staging); ``cupy.asarray(h)``, ``d.set(h)``:
  host-to-device copies, counted.
* ``__cuda_array_interface__`` is there (pointing at the host memory behind the array), so hpcpar's
  communicator takes its device path, and an MPI that is told it is CUDA-aware reads that memory.

``cuda`` (device count, ``Device(i).use()``, streams whose ``synchronize`` is recorded) and ``cupyx``
(``scatter_add``, ``empty_pinned``) are the stand-ins of the CUDA runtime parts hpcpar calls.
"""
import sys

import numpy as np

from fake_cupy import cuda
from fake_cupy.transfers import log as _log

__version__ = "stand-in"

_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")


def _device(value):
    """The numpy array behind a device array; scalars pass; a host array is refused (CuPy: TypeError)."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)}")
    if isinstance(value, (list, tuple)):
        return type(value)(_device(v) for v in value)
    return value


def _wrap(result):
    """numpy results back to device arrays; a reduction's numpy scalar becomes a 0-d device array."""
    if isinstance(result, np.ndarray):
        return ndarray(result)
    if isinstance(result, np.generic):
        return ndarray(np.asarray(result))
    if isinstance(result, (tuple, list)):                      # split, nonzero, ...
        return type(result)(_wrap(r) for r in result)
    return result


def _call(fn, args, kwargs):
    if np.dtype(kwargs.get("dtype")).name == "bfloat16":
        raise TypeError("Unsupported dtype bfloat16")         # the stand-in is a CuPy before v14
    out = kwargs.get("out")
    result = fn(*_device(args), **{k: _device(v) for k, v in kwargs.items()})
    return out if isinstance(out, ndarray) else _wrap(result)


class ndarray:                                                  # noqa: N801 - CuPy's name
    """Device memory: a numpy array nobody may read without a counted copy."""
    __array_ufunc__ = None          # numpy's ufuncs and operators refuse it: TypeError, as CuPy

    def __init__(self, host_array):
        self._a = host_array

    # --- what describes the array (no copy) ---------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T))

    @property
    def __cuda_array_interface__(self):
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.__array_interface__["data"][0], False),
                "strides": None if a.flags.c_contiguous else a.strides, "version": 3}

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"fake_cupy.ndarray(shape={self.shape}, dtype={self.dtype})"

    # --- to the host: refused, or counted -----------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError(_IMPLICIT)

    def get(self, stream=None, out=None):
        _log.d2h("pinned" if isinstance(out, PinnedArray) else "get", self.nbytes)
        if out is None:
            return self._a.copy()
        np.copyto(out, self._a)
        return out

    def set(self, host, stream=None):
        _log.h2d("set", self.nbytes)
        np.copyto(self._a, host)

    def _implicit(self, how):
        _log.d2h(how, self.nbytes)
        return self._a

    def __float__(self):
        return float(self._implicit("float()"))

    def __int__(self):
        return int(self._implicit("int()"))

    def __bool__(self):
        return bool(self._implicit("bool()"))

    def item(self):
        return self._implicit(".item()").item()

    def tolist(self):
        return self._implicit(".tolist()").tolist()

    # --- indexing -----------------------------------------------------------------------------
    def __getitem__(self, key):
        return _wrap(self._a[_device(key)])

    def __setitem__(self, key, value):
        self._a[_device(key)] = _device(value)

    def __iter__(self):
        return (ndarray(row) if isinstance(row, np.ndarray) else _wrap(row) for row in self._a)


def _method(name):
    def call(self, *args, **kwargs):
        return _call(getattr(self._a, name), args, kwargs)
    call.__name__ = name
    return call


def _binary(name):
    def call(self, other):
        result = getattr(self._a, name)(_device(other))
        return NotImplemented if result is NotImplemented else _wrap(result)
    call.__name__ = name
    return call


def _inplace(name):
    def call(self, other):
        getattr(self._a, name)(_device(other))
        return self
    call.__name__ = name
    return call


for _name in ("reshape", "transpose", "astype", "copy", "sum", "max", "min", "mean", "view", "ravel",
              "fill", "argmax", "swapaxes", "squeeze", "dot", "any", "all", "cumsum", "flatten", "clip"):
    setattr(ndarray, _name, _method(_name))
for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor"):
    for _name in (f"__{_op}__", f"__r{_op}__"):
        setattr(ndarray, _name, _binary(_name))
    setattr(ndarray, f"__i{_op}__", _inplace(f"__i{_op}__"))
for _name in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
    setattr(ndarray, _name, _binary(_name))
for _name in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(ndarray, _name, _method(_name))
ndarray.__hash__ = None


class PinnedArray(np.ndarray):
    """Host memory from ``cupyx.empty_pinned``: a numpy array (as in CuPy), marked to count as staging."""


# --- the module's functions -------------------------------------------------------------------

def asarray(a, dtype=None, order=None):
    """Host data goes to the device (a counted copy); a device array stays where it is."""
    if isinstance(a, ndarray):
        return a if dtype is None else a.astype(dtype, copy=False)
    if isinstance(a, np.ndarray):
        _log.h2d("asarray", a.nbytes)
    return ndarray(np.array(a, dtype=dtype, order=order or "K"))


array = asarray


def asnumpy(a, stream=None, out=None):
    if isinstance(a, ndarray):
        return a.get(out=out)
    return np.asarray(a)


def get_array_module(*args):
    return sys.modules["cupy"] if any(isinstance(a, ndarray) for a in args) else np


def __getattr__(name):
    """Every other name is numpy's: constants and dtypes as they are, functions on device arrays."""
    attr = getattr(np, name)
    if callable(attr) and not isinstance(attr, type):
        def call(*args, **kwargs):
            return _call(attr, args, kwargs)
        call.__name__ = name
        return call
    return attr


def install(monkeypatch):
    """Put the stand-in in sys.modules as ``cupy`` and ``cupyx`` (for the duration of one test)."""
    from fake_cupy import cupyx
    me = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "cupy", me)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    _log.reset()
    cuda.reset()
    return me
