"""A stand-in for `hpcpar train` in the Slurm tests, until training writes real checkpoints.

It takes the same flags (ignoring those it does not use) and keeps the same exit-status contract,
so jobs/preemptible.sbatch can be tested end to end today: it counts --steps steps of 0.1 s, and on
SIGUSR1 or SIGTERM it saves the step it reached in --save DIR and exits 3 ("preempted, checkpoint
written"); started with --resume DIR, it continues from the step saved there.  One rank, no MPI.
"""
import argparse
import os
import signal
import sys
import time

EXIT_PREEMPTED = 3

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--save")
parser.add_argument("--resume")
args, _ = parser.parse_known_args()

stop = []
signal.signal(signal.SIGUSR1, lambda signum, frame: stop.append(signum))
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

step = 0
saved = os.path.join(args.resume or "", "step")
if args.resume and os.path.exists(saved):
    step = int(open(saved).read())
    print(f"fake-train: resumed at step {step}", flush=True)
else:
    print("fake-train: fresh start", flush=True)
print("fake-train: running", flush=True)

while step < args.steps:
    if stop:
        with open(os.path.join(args.save, "step"), "w") as f:
            f.write(str(step))
        print(f"fake-train: preempted by signal {stop[0]} at step {step}, checkpoint written", flush=True)
        sys.exit(EXIT_PREEMPTED)
    time.sleep(0.1)
    step += 1
print(f"fake-train: done, {step} steps", flush=True)
