"""Exercise 21 (docs/course/12-hangs.md): read the flight records of a hung job.

`records` maps a rank to the record it wrote when the job was ended (a rank that wrote nothing is not
in it).  A record is a dict; a rank that died has "dead": "<how>" and no operations.  Otherwise
"ops" lists its last communication operations, oldest first, each a dict:

    id      the operation's number on this rank (0, 1, 2, ...)
    op      all_reduce, all_gather, reduce_scatter, bcast, barrier, send, recv
    group   tp, pp, dp, world ...
    seq     collectives: the how-manieth collective on that group (the same operation on every member)
    peer    send/recv: the other rank (a world rank)
    start   when it was called or posted
    wait    when the rank began to block on it (None: posted, never waited for)
    end     when it completed (None: not completed)

Return (culprits, waits):
    culprits   sorted list of the ranks that hold the others up: ranks without a record or dead; when
               every rank answered, the live ranks blocked in no operation
    waits      {rank: (group, op, seq for a collective, peer for a send/recv)} of every live rank
               blocked in an operation - the one it cannot get past

Check: .venv/bin/hpcpar course check 21          Compare: .venv/bin/hpcpar trace why RUN/flight
"""


def hang_diagnosis(records, world):
    raise NotImplementedError
