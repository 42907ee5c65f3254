"""``cupy.cuda`` of the stand-in: device count and selection, streams, and the cuBLAS math mode.

``FAKE_CUPY_DEVICES`` sets how many devices it reports (default 1, like the one-GPU test machine).
"""
import os


class _Record:
    def __init__(self):
        self.current_device = 0     # Device(i).use() sets it
        self.synchronized = 0       # Stream.synchronize() calls
        self.compute_types = {}     # dtype name -> cuBLAS compute type set (cupy._core._routines_linalg)


record = _Record()


def reset():
    record.__init__()


class CUDARuntimeError(RuntimeError):
    pass


class runtime:                                                  # noqa: N801 - a namespace, as in CuPy
    CUDARuntimeError = CUDARuntimeError

    @staticmethod
    def getDeviceCount():                                       # noqa: N802 - CUDA's name
        return int(os.environ.get("FAKE_CUPY_DEVICES", "1"))

    @staticmethod
    def getDeviceProperties(i):                                 # noqa: N802
        return {"name": b"CuPy stand-in (numpy on the host)", "major": 9, "minor": 0,
                "totalGlobalMem": 2**30, "multiProcessorCount": 1}


class Device:
    def __init__(self, device=None):
        self.id = record.current_device if device is None else device

    def use(self):
        if not 0 <= self.id < runtime.getDeviceCount():
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id}")
        record.current_device = self.id

    def synchronize(self):
        record.synchronized += 1


class Stream:
    def synchronize(self):
        record.synchronized += 1


_stream = Stream()


def get_current_stream():
    return _stream
