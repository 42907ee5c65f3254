"""Who waited for whom: the flight records of a hung or broken job merged into one paragraph.

    hpcpar trace why RUN/flight

Every rank that could still run wrote ``rank-N.json`` (hpcpar/comm/flight.py) when the job was ended: the
operation it is blocked in, with the group and that group's collective number, or the rank it waits
to hear from.  A rank without a record did not respond - it is stopped, swapping, stuck in I/O, or
gone.  A rank that died has a record written for it by its guard process (hpcpar/watch/rank_guard.py) with
the signal or exit status.  The diagnosis:

1. the culprits: ranks that died, ranks that left no record, and ranks that are not inside any
   communication (they compute, or loop, while the others wait for them);
2. where each culprit stopped: its own last step and micro-batch when it has a record, else what its
   partners wait on - a receive from it means it never sent; a collective of a group it belongs to
   means it never arrived;
3. what everyone else waits on, grouped: "ranks 0,1,3-7 wait in the world all-reduce #50".

Pure functions of the records: tests feed them synthetic ones.
"""
from collections import defaultdict

from hpcpar.comm.flight import read_records

NAMES = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
         "all_to_all": "all-to-all", "all_to_allv": "all-to-all-v", "bcast": "broadcast", "barrier": "barrier",
         "send": "send", "recv": "recv"}


def rank_list(ranks):
    """[0, 1, 3, 4, 5, 6, 7] -> "0,1,3-7": runs of three or more as a range."""
    ranks, parts, i = sorted(ranks), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return ",".join(parts)


def ranks_phrase(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_list(ranks)


def blocked_in(record):
    """The operation this rank blocks in (the oldest it waits on), or None."""
    waiting = [op for op in record.get("ops", []) if op["end"] is None and op["wait"] is not None]
    return min(waiting, key=lambda op: op["id"]) if waiting else None


def describe_op(op):
    """'the tp all-reduce #1234' / 'the pp recv from rank 2'."""
    name = NAMES.get(op["op"], op["op"])
    if op["peer"] is None:
        return f"the {op['group']} {name} #{op['seq']}"
    return f"the {op['group']} {name} {'from' if op['op'] == 'recv' else 'to'} rank {op['peer']}"


def coords_of(rank, records):
    """'tp 0, pp 1, dp 0' from the dead rank's own record or from the layout any record carries."""
    from hpcpar.comm.grid import AXES, Coord, GridLayout
    own = records.get(rank, {}).get("coords")
    if own:
        return Coord(**own).words()
    layout = next((r["layout"] for r in records.values() if r.get("layout")), None)
    if layout is None:
        return "coordinates unknown"
    return GridLayout(layout["world"], layout["order"], **{a: layout[a] for a in AXES if a in layout}) \
        .coord(rank).words()


def where(record):
    """'step 50, micro-batch 3 (F)' from a rank's own record (steps counted from 1, as the loop prints)."""
    if record.get("step", -1) < 0:
        return "before the first step"
    text = f"step {record['step'] + 1}"
    if record.get("mb") is not None:
        text += f", micro-batch {record['mb']}"
    if record.get("action"):
        text += f" ({record['action']})"
    elif record.get("phase") not in (None, "step"):
        text += f" ({record['phase']})"
    return text


def waits_for(record, rank):
    """Does this waiting record wait on ``rank``? Returns the operation, or None."""
    op = blocked_in(record)
    if op is None:
        return None
    if op["peer"] is not None:
        return op if op["peer"] == rank else None
    return op if rank in record.get("groups", {}).get(op["group"], ()) else None


def culprit_sentence(rank, records, waiting):
    """One sentence on a rank that holds the others up."""
    own = records.get(rank)
    who = f"rank {rank} ({coords_of(rank, records)})"
    if own and own.get("dead"):
        return f"{who} {own['dead']} in {where(own)}"
    if own:
        return f"{who} is outside any recorded communication, in {where(own)}, for {own.get('idle_s', 0):.1f} s"
    blocking = [(w, waits_for(rec, rank)) for w, rec in sorted(waiting.items()) if waits_for(rec, rank)]
    p2p = [(w, op) for w, op in blocking if op["peer"] is not None]
    if p2p:                     # rank w waits to receive from it (it never sent), or to send to it
        w, op = p2p[0]
        mine = f"send to rank {w}" if op["op"] == "recv" else f"recv from rank {w}"
        return f"{who} stopped in {where({**waiting[w], 'action': None})}, before its {op['group']} {mine} " \
               f"(it left no flight record)"
    if blocking:                # the smallest group that waits for it says the most
        w, op = min(blocking, key=lambda wo: len(waiting[wo[0]]["groups"][wo[1]["group"]]))
        return f"{who} stopped in step {waiting[w]['step'] + 1}, before {describe_op(op)} (it left no flight record)"
    return f"{who} stopped (it left no flight record)"


def state(record):
    """What a rank that is not a culprit is doing: the operation it waits in, or where it is."""
    op = blocked_in(record)
    if op is None:
        return f"are in {where(record)}, outside any recorded communication"
    mb = record.get("mb")
    return "wait in " + describe_op(op) + (f" (micro-batch {mb})" if op["peer"] is not None and mb is not None
                                            else "")


def culprits(records, world=None):
    """The ranks the others wait for: the dead and the silent; when every rank answered, those not
    inside communication.  ``world`` defaults to the layout in the records."""
    layout = next((r["layout"] for r in records.values() if r.get("layout")), None)
    world = world or (layout["world"] if layout else max(records) + 1)
    alive = {r: rec for r, rec in records.items() if not rec.get("dead")}
    waiting = {r: rec for r, rec in alive.items() if blocked_in(rec)}
    return sorted(r for r in range(world) if r not in alive) or sorted(set(alive) - set(waiting))


def diagnose(records, world=None):
    """The paragraph for {rank: record}; ``world`` defaults to the layout in the records."""
    if not records:
        raise ValueError("no flight records")
    alive = {r: rec for r, rec in records.items() if not rec.get("dead")}
    waiting = {r: rec for r, rec in alive.items() if blocked_in(rec)}
    named = culprits(records, world)
    sentences = [culprit_sentence(r, records, waiting) for r in named] or [
        "every rank waits inside communication: the ranks wait on each other (a deadlock, or collectives "
        "called in different orders)"]
    groups = defaultdict(list)
    for r, rec in alive.items():
        if r not in named:
            groups[state(rec)].append(r)
    if groups:
        sentences.append("; ".join(f"{ranks_phrase(rs)} {what if len(rs) > 1 else singular(what)}"
                                   for what, rs in sorted(groups.items(), key=lambda kv: min(kv[1]))))
    else:
        sentences.append("no other rank left a record")
    text = "; ".join(sentences)
    first = min((rec for rec in records.values() if rec.get("reason")), key=lambda rec: rec.get("time", 0),
                default=None)
    if first is not None:
        text += f". First to notice: rank {first['rank']}, {first['reason']}."
    return text


def singular(verb_phrase):
    """'wait in ...' -> 'waits in ...', 'are in ...' -> 'is in ...'."""
    verb, rest = verb_phrase.split(" ", 1)
    return {"wait": "waits", "are": "is"}[verb] + " " + rest


def explain(directory):
    """The diagnosis of the records in ``directory``."""
    records = read_records(directory)
    if not records:
        raise ValueError(f"no flight records (rank-N.json) in {directory}")
    return diagnose(records)
