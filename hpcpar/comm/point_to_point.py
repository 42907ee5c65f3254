"""The messages between two ranks: send, receive, their non-blocking forms, and a send-receive pair.

A part of ``Communicator`` (communicator.py), which brings what every call goes through: ``_blocking``
and ``_posted`` (counted, timed, seen by the tracer and the flight recorder), ``_copy`` of a strided
input and ``buffers`` (what MPI is handed: buffers.py).  An input that is not contiguous is copied and
counted; a receive buffer that is not contiguous is refused: never silently wrong.
"""
from hpcpar.comm.requests import Request


def refuse_strided(x, what):
    raise ValueError(f"{what} must be a C-contiguous array (got strides {x.strides})")


class PointToPoint:
    def send(self, x, dest, tag=0):
        if not x.flags.c_contiguous:
            x = self._copy(x)
        self._blocking("send", x.nbytes, dest, self.mpi.Send, (self.buffers.reading(x, "p2p_send"), dest, tag))

    def recv_(self, out, source, tag=0):
        """Receive into ``out`` (contiguous, of the sender's shape and dtype)."""
        if not out.flags.c_contiguous:
            refuse_strided(out, "receive buffer")
        buf, finish = self.buffers.writing(out, "p2p_recv")
        self._blocking("recv", out.nbytes, source, self.mpi.Recv, (buf, source, tag))
        if finish:
            finish()
        return out

    def isend(self, x, dest, tag=0):
        """Start sending x; the Request keeps x alive until it completes (do not modify x before)."""
        if not x.flags.c_contiguous:
            x = self._copy(x)
        buf = self.buffers.reading(x, ("isend", dest, tag))
        return self._posted("send", x.nbytes, dest,
                            Request(self.mpi.Isend(buf, dest, tag), (x, buf), stats=self.stats))

    def irecv_(self, out, source, tag=0):
        """Post a receive into ``out``; its values are valid after the Request's wait()."""
        if not out.flags.c_contiguous:
            refuse_strided(out, "receive buffer")
        buf, finish = self.buffers.writing(out, ("irecv", source, tag))
        return self._posted("recv", out.nbytes, source,
                            Request(self.mpi.Irecv(buf, source, tag), (out, buf), finish, self.stats))

    def sendrecv(self, x, dest, out, source, tag=0):
        """Send x to ``dest`` and receive ``out`` from ``source`` in one deadlock-free call.  Counted as
        a send and a receive; the seconds it blocks, the flight recorder and the trace see the receive
        (what it waits for: the send of a small message completes at once)."""
        if not x.flags.c_contiguous:
            x = self._copy(x)
        if not out.flags.c_contiguous:
            refuse_strided(out, "receive buffer")
        self.stats.add("send", x.nbytes)
        buf, finish = self.buffers.writing(out, "sendrecv")
        send = self.buffers.reading(x, "sendrecv_send")
        self._blocking("recv", out.nbytes, source, self.mpi.Sendrecv, (send, dest, tag, buf, source, tag))
        if finish:
            finish()
        return out
