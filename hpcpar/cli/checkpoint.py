"""Inspect and convert checkpoints (no MPI needed).

  hpcpar checkpoint inspect ckpt/                  layout, step, tensors; verifies every checksum
  hpcpar checkpoint convert ckpt/ model.safetensors    full weights with GPT-2 names
  hpcpar checkpoint convert ckpt/ one/             one piece per tensor (loads under any layout)
  hpcpar checkpoint convert model.safetensors ckpt/    weights -> a checkpoint at step 0

A sharded checkpoint loads under any layout directly (`hpcpar train --resume DIR` with other --tp,
--pp, --dp); convert is for leaving or entering hpcpar.
"""
HELP = "inspect or convert checkpoints"


def add_arguments(p):
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    i = sub.add_parser("inspect", help="describe a checkpoint or weights file and verify its checksums")
    i.add_argument("path")
    c = sub.add_parser("convert", help="convert between sharded checkpoints and consolidated weights")
    c.add_argument("src")
    c.add_argument("dst")


def run(args):
    from hpcpar.checkpoint.convert import convert, inspect
    from hpcpar.checkpoint.files import CheckpointError
    from hpcpar.runtime import UsageError
    try:
        if args.action == "inspect":
            print(inspect(args.path))
        else:
            print(f"wrote {convert(args.src, args.dst)}")
    except CheckpointError as err:
        raise UsageError(str(err)) from None
    return 0
