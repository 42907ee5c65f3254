"""What every benchmark shares: side-by-side timing, the result format, and small MPI and torch helpers.

Timing on a shared machine.  The benchmark machine has two cores that other jobs use too, so any one
timing can be off by tens of per cent.  Every comparison is therefore measured side by side in one
process: the candidates run in turn, round after round, in a rotating order (A B C, B C A, C A B, ...,
so that none always runs first or right after the same neighbour), and a table reports each one's
best round - the run least disturbed - and the ratio of the best rounds.  Rows against PyTorch quote
the median of at least ``PEER_ROUNDS`` per-round ratios with their lowest and highest (``spread``): a
ratio whose range straddles a target is not a result on that machine.

Serial benchmarks time process CPU seconds (``time.process_time``): another job taking the core away
does not inflate them, and for one thread on an idle core they equal wall seconds.  MPI benchmarks
time wall seconds (a rank waiting in MPI spins, so its CPU time says nothing), with a barrier before
every timed call and the slowest rank's time kept.
"""
import statistics
import time

import numpy as np

# The model the step benchmarks share: a small GPT-2 (untied output projection, since PyTorch's
# pipeline stages cannot share a weight across ranks), fp32, sized so that `make bench` stays well
# under ten minutes on two cores.  The data is the synthetic language (32 tokens); the model's
# vocabulary is larger so that the output layer costs what it costs in a real model.
BENCH_MODEL = dict(hidden=256, layers=4, heads=4, seq_len=128, vocab=1024, batch_size=16)


def interleave(cases, rounds, clock=time.process_time, before=None):
    """Time each of ``cases`` (name -> function, one timed call) ``rounds`` times, in a rotating order.

    Every case runs once untimed first (page faults, BLAS buffers, lazy initialisation).  ``before``
    runs ahead of every call, untimed (a barrier).  Returns name -> list of seconds, one per round."""
    names = list(cases)
    times = {n: [] for n in names}
    for n in names:
        if before:
            before()
        cases[n]()
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            if before:
                before()
            start = clock()
            cases[n]()
            times[n].append(clock() - start)
    return times


def slowest_rank(comm, times):
    """Per round, the slowest rank's time (MPI benchmarks): name -> list of seconds, on every rank."""
    from mpi4py import MPI
    out = {}
    for n, ts in times.items():
        slowest = np.array(ts)
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        out[n] = list(slowest)
    return out


def best(ts):
    return min(ts)


def paired_ratio(a, b):
    """Median over rounds of a[i] / b[i]: the ratio with the machine's drift cancelled round by round."""
    return statistics.median(x / y for x, y in zip(a, b))


# A PyTorch-peer row is quoted as the median of at least this many alternating rounds, with its spread.
PEER_ROUNDS = 5


def summary(times, ours, theirs):
    """Figures of one side-by-side comparison, for the JSON: best rounds and their ratio, and - the
    figure the peer tables quote - the median of the per-round ratios ours[i] / theirs[i] with their
    spread (lowest and highest round), so that a reader sees how far one run's ratio can move."""
    paired = [a / b for a, b in zip(times[ours], times[theirs])]
    return {"ours_s": best(times[ours]), "theirs_s": best(times[theirs]),
            "ours_median_s": statistics.median(times[ours]), "theirs_median_s": statistics.median(times[theirs]),
            "ratio": best(times[ours]) / best(times[theirs]),
            "ratio_median_paired": statistics.median(paired), "ratio_min": min(paired), "ratio_max": max(paired),
            "rounds": len(paired)}


def spread(fig):
    """'0.88x (0.84-0.93, 5 rounds)': the median per-round ratio of a ``summary``, its range, its rounds."""
    return f"{fig['ratio_median_paired']:.2f}x ({fig['ratio_min']:.2f}-{fig['ratio_max']:.2f}, {fig['rounds']} rounds)"


# --- formatting -------------------------------------------------------------------------------

def ms(seconds):
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def us(seconds):
    return f"{seconds * 1e6:.3g} us"


def size(nbytes):
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024


def rate(bytes_per_s):
    return f"{bytes_per_s / 1e9:.3g} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.3g} MB/s"


def ratio(x):
    return f"{x:.2f}x"


def pct(x):
    return f"{100 * x:.0f}%"


# --- the result of one benchmark run --------------------------------------------------------------

class Result:
    """Tables for BENCHMARKS.md, raw figures and targets for the JSON."""

    def __init__(self, note=None):
        self.tables, self.figures, self.targets = [], {}, []
        self.notes = [note] if note else []

    def table(self, title, columns, rows, notes=()):
        self.tables.append({"title": title, "columns": list(columns),
                            "rows": [[str(c) for c in row] for row in rows], "notes": list(notes)})

    def target(self, what, goal, value, met):
        """A goal the benchmark is held to, with its measured value (reported, never asserted)."""
        self.targets.append({"what": what, "goal": goal, "value": value, "met": bool(met)})

    def as_dict(self):
        return {"tables": self.tables, "figures": self.figures, "targets": self.targets, "notes": self.notes}


# --- PyTorch, the reference ----------------------------------------------------------------------

def import_torch():
    """(torch, None) with one intra-op thread, or (None, the reason the torch rows are skipped)."""
    try:
        import torch
    except ImportError as err:
        return None, f"PyTorch is not installed ({err}); pip install torch==2.13.0 to compare"
    torch.set_num_threads(1)
    return torch, None


def torch_tensor(torch, a):
    """A numpy array as a torch tensor (copied, so both sides own their memory)."""
    return torch.tensor(np.ascontiguousarray(a))
