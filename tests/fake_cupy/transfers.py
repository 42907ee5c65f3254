"""The stand-in's record of every copy between host and device, by direction and by how it was made."""
from collections import Counter


class TransferLog:
    """``d2h`` / ``h2d``: Counter of copies by how they were made ("get", "float()", "pinned", ...)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.to_host, self.to_device, self.bytes = Counter(), Counter(), 0

    def d2h(self, how, nbytes):
        self.to_host[how] += 1
        self.bytes += nbytes

    def h2d(self, how, nbytes):
        self.to_device[how] += 1
        self.bytes += nbytes

    def host_copies(self):
        """Device-to-host copies other than into pinned staging buffers (those are MPI's, counted apart)."""
        return sum(n for how, n in self.to_host.items() if how != "pinned")


log = TransferLog()
