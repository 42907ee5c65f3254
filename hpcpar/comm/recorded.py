"""Each call of a Communicator entered in the flight recorder (hpcpar/flight.py), when one is installed.

A blocking call is one entry that blocks from its start to its end; a non-blocking one (isend,
iall_reduce_, ...) is entered when posted and completed by its Request (requests.py), which also marks
when this rank began to wait for it.  A group of one rank calls nothing and records nothing.
"""
import functools

from hpcpar import flight


def recorded(op, peer=None, posts=False):
    """Enter the call in the flight recorder (hpcpar/flight.py) when one is installed. ``peer``: the
    (position, name) of the argument naming the other rank; ``posts``: a non-blocking call, whose
    Request completes the entry."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            rec = flight.active()
            if rec is None or self.size == 1:
                return method(self, *args, **kwargs)
            other = None if peer is None else args[peer[0]] if len(args) > peer[0] else kwargs[peer[1]]
            nbytes = args[0].nbytes if args else 0
            entry = rec.begin(op, self.name, other, nbytes, blocking=not posts)
            out = method(self, *args, **kwargs)
            if posts and out is not None:
                out.flight = entry
            else:
                rec.end(entry)
            return out
        return call
    return wrap
