"""What may watch a Communicator's calls: the tracer (hpcpar/trace.py) and the flight recorder
(hpcpar/flight.py).  Neither is on in a plain run, and then a call pays for one check and nothing
else - a 4 KB message spends only ~3.5 us inside MPI, so every layer around it must be thin.

A blocking call is one flight entry from its start to its end; a non-blocking one (isend,
iall_reduce_, ...) is entered when posted and completed by its Request (requests.py), which also
marks when this rank began to wait for it.  A group of one rank calls nothing and records nothing.
"""
import functools
import time

from hpcpar import flight, trace


def observed(op, peer=None, posts=False, span=None):
    """Enter the call in the flight recorder and the tracer when they are on.

    ``op``: the operation's name in the flight recorder; ``peer``: the (position, name) of the
    argument naming the other rank; ``posts``: a non-blocking call, whose Request completes the
    entry; ``span``: the name of its "comm" span in a trace (None: not shown - a posted message
    appears when somebody waits for it)."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            # the two modules' globals read directly: calling active() twice costs ~100 ns a call
            tracer, rec = trace._active, flight._active
            if (tracer is None and rec is None) or self.size == 1:
                return method(self, *args, **kwargs)
            entry = None
            if rec is not None:
                other = None if peer is None else args[peer[0]] if len(args) > peer[0] else kwargs[peer[1]]
                entry = rec.begin(op, self.name, other, args[0].nbytes if args else 0, blocking=not posts)
            start = time.perf_counter()
            out = method(self, *args, **kwargs)
            if tracer is not None and span is not None:
                tracer.span(f"{self.name} {span}", "collective", start, time.perf_counter(), "comm")
            if entry is not None:
                if posts and out is not None:
                    out.flight = entry
                else:
                    rec.end(entry)
            return out
        return call
    return wrap
