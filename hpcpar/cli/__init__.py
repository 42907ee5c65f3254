"""The ``hpcpar`` command: one sub-command per module in this package.

Each module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args)``; heavy imports
(numpy, mpi4py) happen inside ``run`` so that ``hpcpar --help`` and the MPI-free commands are quick
and never initialise MPI.
"""
import argparse
import importlib
import math
import sys

from hpcpar import runtime

# sub-command -> module under hpcpar.cli
COMMANDS = {
    "grid": "grid",
    "demo": "demo",
    "train": "train",
    "data": "data",
    "generate": "generate",
    "checkpoint": "checkpoint",
    "trace": "trace",
    "schedule": "schedule",
    "bench": "bench",
    "plan": "plan",
    "scaling": "scaling",
    "course": "course",
}


def finite(text):
    """The argparse type of every number option: a finite float.  float() takes "nan" and "inf", which
    no option means, and NaN slips through every "v <= 0" test after it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag once (rank 0) and exits 2 on every rank, like UsageError."""

    def error(self, message):
        if runtime.launch_rank() == 0:
            print(f"hpcpar: error: {message} (see: {self.prog} --help)", file=sys.stderr)
        sys.exit(runtime.EXIT_USAGE)


def build_parser():
    parser = _Parser(prog="hpcpar", description="A teachable training engine on MPI: tensor, pipeline, data, context and expert parallelism on one grid.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"hpcpar.cli.{module}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks on errors")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return runtime.EXIT_USAGE
    return runtime.run_guarded(args._run, args, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
