"""Train a GPT (or the deep MLP) on any tp x pp x dp layout of the MPI job.

  hpcpar train --model tiny --steps 300                                  # one rank
  mpiexec -n 8 hpcpar train --tp 2 --pp 2 --dp 2 --schedule 1f1b --microbatches 8 --model small
  mpiexec -n 4 hpcpar train --config run.toml --steps 50                 # flags override the file

Every option is a flag and a key of the TOML file (same name, - or _).  A bad configuration is
refused with one line and exit status 2 on every rank, before any rank communicates.  Exit status:
0 done, 1 failure (the whole job is aborted), 2 bad configuration, 3 preempted after a checkpoint.
"""
import argparse
from dataclasses import fields

from hpcpar.cli import finite

HELP = "train a model on a tp x cp x pp x dp grid"


def add_arguments(p):
    from hpcpar.training.options import GROUPS, TrainConfig
    p.add_argument("--config", default=None, help="TOML file of options (flags given here override it)")
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        group, help_, choices = groups[f.metadata["group"]], f.metadata["help"], f.metadata["choices"]
        if isinstance(f.default, bool):
            if f.default:
                group.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false",
                                   default=argparse.SUPPRESS, help=f"do not: {help_}")
            else:
                group.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=help_)
        else:
            kind = finite if isinstance(f.default, float) else type(f.default)
            group.add_argument(flag, type=kind, choices=choices, default=argparse.SUPPRESS,
                               metavar=None if choices else f.name.upper(),
                               help=f"{help_} (default: {f.default!r})")


def run(args):
    from hpcpar.watch import rank_guard
    from hpcpar.training.options import config_from
    from hpcpar.watch.watchdog import flight_dir
    cfg = config_from(args)
    shrink = cfg.on_failure == "shrink"
    if shrink:
        from hpcpar.comm import ulfm
        ulfm.prepare()                     # before MPI starts
    rank_guard.split(flight_dir(cfg), shrink)      # under a launcher: a parent that names this rank if it dies
    from hpcpar.runtime import start_mpi
    start_mpi()                            # after the fork, and with the heap's freed text kept out of it
    from hpcpar.training.loop import Loop
    relayout = None
    if shrink:
        from hpcpar.tools.plan.survivors import choose
        from hpcpar.training.recovery import relayout_with
        relayout = relayout_with(choose)   # the planner's layout for the survivors of a failure
    try:
        return Loop(cfg, relayout=relayout).run()
    finally:
        rank_guard.leaving()               # whatever status follows is the job's, not a death
