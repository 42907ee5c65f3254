"""Exercise 14 (docs/course/04-pipeline.md): a pipeline exchange that deadlocks.

Two pipeline stages run 1F1B over 4 micro-batches.  PROGRAM lists, for each rank, its instructions in
order: F<mb> / B<mb> compute, sendF<mb>><rank> sends an activation, recvB<mb><<rank> receives a
gradient, and so on.  As given, every message is sent right after the action that makes it and
received right before the action that needs it - and `hpcpar course check 14` runs it with blocking
sends of 8 MB (comm.send, comm.recv_): it deadlocks.

Move the sends and receives (not the compute: the order of F and B stays 1F1B's) so that it runs.
The check first runs your lists in the simulator with blocking sends, then on 2 MPI ranks that must
finish in time, every message arriving with its own data.

Check: .venv/bin/hpcpar course check 14          Simulate: .venv/bin/hpcpar schedule --stages 2 --microbatches 4 --blocking-sends
"""

PROGRAM = [line.split() for line in (
    'F0 sendF0>1 F1 sendF1>1 recvB0<1 B0 F2 sendF2>1 recvB1<1 B1 F3 sendF3>1 recvB2<1 B2 recvB3<1 B3',
    'recvF0<0 F0 B0 sendB0>0 recvF1<0 F1 B1 sendB1>0 recvF2<0 F2 B2 sendB2>0 recvF3<0 F3 B3 sendB3>0',
)]
