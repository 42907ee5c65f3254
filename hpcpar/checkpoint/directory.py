"""A checkpoint directory's bookkeeping: which steps it holds and which run wrote each, publishing a
step so that a reader always finds a complete one, and rotation that cannot delete a good step.

    DIR/latest                   the name of the newest published step (replaced atomically)
    DIR/step-00000120/           a published step: its manifest.json is written last, so a step
                                 directory with a manifest is complete
    DIR/step-00000120.partial/   a step being written (or left by a save that was killed)
    DIR/step-00000120.old/       the previous copy of a step written again, between two renames

The rules (docs/checkpoints.md, "What is never deleted"):

* a step is published by one rename, and ``latest`` is repointed only after it; a step written a
  second time (the stop path saving the step a --save-every just saved) is swapped in with one
  atomic exchange, or - where the file system cannot - by two renames, and a reader that finds
  ``latest`` naming a step caught between them takes its complete copy (``resolve``); the next save
  finishes the job (``repair``);
* rotation comes after the new step is published, counts steps by their number (not their names),
  only among the steps of the run that saves (the manifest's ``run``), and never deletes the step just
  written.  A run that continues another with --resume continues its run id.
"""
import json
import re
import shutil
from pathlib import Path

from hpcpar.checkpoint.files import CheckpointError, exchange, fsync_dir, write_atomic

STEP = re.compile(r"^step-(\d+)$")
LEFTOVER = re.compile(r"^(step-\d+)\.(partial|old)$")


def step_name(step):
    return f"step-{step:08d}"


def folder_step(step_dir):
    """The step a step directory's name says (step-N, or its .partial / .old copy), or None."""
    m = re.match(r"^step-(\d+)(\.partial|\.old)?$", Path(step_dir).name)
    return int(m.group(1)) if m else None


def complete(step_dir):
    return (Path(step_dir) / "manifest.json").is_file()


def steps(root):
    """{step number: directory} of the complete published steps under ``root``."""
    root = Path(root)
    found = {}
    for d in root.glob("step-*") if root.is_dir() else ():
        m = STEP.match(d.name)
        if m and complete(d):
            found[int(m.group(1))] = d
    return found


def run_of(step_dir):
    """The id of the run that wrote a step (None for one written before runs had ids, or unreadable)."""
    try:
        return json.loads((Path(step_dir) / "manifest.json").read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def _named(root):
    """The step ``latest`` names, or None when there is no ``latest``."""
    pointer = Path(root) / "latest"
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text().strip()
    except OSError as err:
        raise CheckpointError(f"{pointer} is unreadable: {err.strerror or err}") from None
    if not STEP.match(name):
        raise CheckpointError(f"{pointer} names {name!r}, which is not a step directory")
    return name


def resolve(root):
    """The complete step directory to read under ``root``: the one ``latest`` names - or, when a save was
    killed between the two renames of a step written again, its complete copy - or, without ``latest``,
    the highest-numbered complete step; None when the directory holds no step."""
    root = Path(root)
    name = _named(root)
    if name is None:
        found = steps(root)
        return found[max(found)] if found else None
    for candidate in (name, name + ".partial", name + ".old"):      # new copy first, then the old one
        if complete(root / candidate):
            return root / candidate
    raise CheckpointError(f"{root / 'latest'} names {name}, which is missing or incomplete")


def repair(root):
    """Before a save (rank 0, under the directory's lock): finish a publish that was interrupted, so the
    step ``latest`` names is in its place, and remove what interrupted saves left."""
    root = Path(root)
    named = _named(root)
    for d in sorted(root.glob("step-*")):
        m = LEFTOVER.match(d.name)
        if not m or not d.exists():
            continue
        final = root / m.group(1)
        partial, old = root / (m.group(1) + ".partial"), root / (m.group(1) + ".old")
        if not complete(final):
            # the new copy of the step latest names, else the published copy that was moved aside
            source = partial if m.group(1) == named and complete(partial) else old if complete(old) else None
            if source is not None:
                shutil.rmtree(final, ignore_errors=True)
                source.rename(final)
        for leftover in (partial, old):
            shutil.rmtree(leftover, ignore_errors=True)
    fsync_dir(root)


def publish(root, partial, step):
    """Put the complete ``partial`` directory in place as step ``step`` and point ``latest`` at it."""
    root = Path(root)
    final = root / step_name(step)
    previous = None
    if final.exists():                       # the same step again: swap the new copy in
        if exchange(partial, final):
            previous = partial               # the old copy, now under the partial's name
        else:
            previous = root / (final.name + ".old")
            shutil.rmtree(previous, ignore_errors=True)
            final.rename(previous)           # killed here: resolve() reads the .partial, repair() fixes
            partial.rename(final)
    else:
        partial.rename(final)
    fsync_dir(root)
    write_atomic(root / "latest", (final.name + "\n").encode())
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    return final


def rotate(root, run, keep, written):
    """Delete all but the ``keep`` highest-numbered steps of run ``run`` - never ``written``, never a step
    of another run."""
    own = sorted(n for n, d in steps(root).items() if run_of(d) == run)
    kept = set(own[-keep:] if keep else own) | {written}
    for n in own:
        if n not in kept:
            shutil.rmtree(Path(root) / step_name(n), ignore_errors=True)
