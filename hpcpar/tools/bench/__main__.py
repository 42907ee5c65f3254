"""One benchmark in this process (under mpiexec when it needs ranks); the driver starts these.

    python -m hpcpar.tools.bench NAME --out FILE [--quick]

Rank 0 writes the result as JSON to FILE.  Nothing else is printed on success.
"""
import argparse
import importlib
import json
import sys
from pathlib import Path

from hpcpar.tools.bench import BENCHMARKS


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hpcpar.tools.bench")
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--out", required=True, help="JSON file for the result (rank 0)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds (smoke test)")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"hpcpar.tools.bench.{BENCHMARKS[args.name].module}")
    result = module.run(args.quick)
    if result is not None:
        Path(args.out).write_text(json.dumps(result.as_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
