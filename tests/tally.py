"""The last lines of `make test`: the counts of its pytest sessions (serial, then each MPI world size),
summed, and the reference tests that were skipped with the command that enables them (conftest.py
appends one JSON line per session to the file named on the command line)."""
import json
import sys

from reference import ENABLE, WHY_OPTIONAL

KINDS = ("passed", "failed", "error", "skipped")


def main(path):
    sessions = [json.loads(line) for line in open(path) if line.strip()]
    for s in sessions:
        where = f"MPI, {s['world']} ranks" if s["world"] else "serial"
        print(f"make test: {where:<13} " + ", ".join(f"{s[k]} {k}" for k in KINDS))
    total = {k: sum(s[k] for s in sessions) for k in KINDS}
    print("make test: total         " + ", ".join(f"{total[k]} {k}" for k in KINDS))
    skipped = sum(s["reference_skipped"] for s in sessions)
    if skipped:
        print(f"make test: {skipped} of the skipped are reference tests (PyTorch, transformers); run them with "
              f"`{ENABLE}` and `make test` again ({WHY_OPTIONAL})")


if __name__ == "__main__":
    main(sys.argv[1])
