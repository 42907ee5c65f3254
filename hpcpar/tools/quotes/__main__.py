"""``python -m hpcpar.tools.quotes [--check] [--fast] PAGE.md ...`` (``make docs``): run every console block's
commands and rewrite the quotes that no longer match their output.

  --check   change nothing; list the stale quotes and exit 1 if there are any
  --fast    leave out the blocks marked ``console slow`` (minutes of training)
"""
import argparse
import os
import sys

from hpcpar.tools.quotes.pages import check_page
from hpcpar.tools.quotes.runner import Session


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hpcpar.tools.quotes", description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="+")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a stale quote")
    parser.add_argument("--fast", action="store_true", help="leave out the blocks marked slow")
    args = parser.parse_args(argv)
    session = Session()
    stale = 0
    try:
        for page in args.pages:
            text, problems, checked = check_page(session, page, slow=not args.fast)
            print(f"{page}: {checked} blocks, {'up to date' if not problems else f'{len(problems)} stale'}",
                  flush=True)
            for p in problems:
                print("  " + p.replace("\n", "\n  "))
            stale += len(problems)
            if problems and not args.check:
                tmp = page + ".tmp"
                with open(tmp, "w") as f:
                    f.write(text)
                os.replace(tmp, page)          # atomic: a page is never half written
    finally:
        session.close()
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
