"""`hpcpar checkpoint convert` and `inspect`: work on checkpoints without MPI.

convert CHECKPOINT out.safetensors   the full weights, GPT-2 names (what other tools load)
convert CHECKPOINT OUTDIR            a one-piece-per-tensor checkpoint, optimizer state included:
                                     loads under any layout like any other checkpoint
convert weights.safetensors OUTDIR   a checkpoint at step 0 from consolidated weights (fresh optimizer)

OUTDIR must not hold a checkpoint (a run's directory, or the source itself): nothing is overwritten.
"""
import shutil
from pathlib import Path

from hpcpar.checkpoint.consolidated import read_weights, write_weights
from hpcpar.checkpoint.directory import publish, step_name, steps
from hpcpar.checkpoint.files import FORMAT, CheckpointError, fsync_dir, sha256, write_atomic, write_json
from hpcpar.checkpoint.load import CheckpointReader, latest_checkpoint

from safetensors.numpy import save as safetensors_bytes


def open_checkpoint(path):
    path = Path(path)
    if (path / "manifest.json").is_file():
        return CheckpointReader(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint directory")
    step_dir = latest_checkpoint(path)
    if step_dir is None:
        raise CheckpointError(f"{path} holds no complete checkpoint")
    return CheckpointReader(step_dir)


def write_one_piece(tensors, out_dir, step, optimizer, config, model=None):
    """A checkpoint whose every tensor is one piece in one file (the consolidated layout), written through
    step-N.partial and published like a trainer's (directory.publish)."""
    out = Path(out_dir)
    partial = out / (step_name(step) + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    data = safetensors_bytes(tensors, metadata={"format": FORMAT, "step": str(step)})
    write_atomic(partial / "rank-00000.safetensors", data)
    names = sorted(k for k in tensors if not k.startswith("optimizer/"))
    write_json(partial / "manifest.json", {
        "format": FORMAT, "step": step, "run": None, "layout": {"tp": 1, "pp": 1, "dp": 1}, "config": config,
        **({"model": model} if model else {}), "optimizer": optimizer,
        "tensors": {n: {"shape": list(tensors[n].shape), "dtype": str(tensors[n].dtype),
                        "files": {"0": "rank-00000.safetensors"}} for n in names},
        "files": {"rank-00000.safetensors": {"sha256": sha256(partial / "rank-00000.safetensors"),
                                             "bytes": len(data)}}})
    fsync_dir(partial)
    return publish(out, partial, step)


def _fresh(dst):
    """Refuse a destination that holds a checkpoint already: converting into it would repoint its
    ``latest`` (the next resume would go on from the converted step and overwrite the trained ones)."""
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(f"{dst} exists and is not a directory: convert into a new directory")
    held = dst.is_dir() and ((dst / "latest").exists() or (dst / "manifest.json").exists() or steps(dst))
    if held:
        raise CheckpointError(f"{dst} holds a checkpoint already: convert into a new directory (nothing was "
                              f"written)")


def convert(src, dst):
    src, dst = Path(src), Path(dst)
    if src.suffix == ".safetensors":
        if dst.suffix == ".safetensors":
            raise CheckpointError("converting a weights file to a weights file does nothing")
        _fresh(dst)
        weights = read_weights(src)
        return write_one_piece(weights, dst, 0, {"name": None, "t": 0, "states": []}, {})
    reader = open_checkpoint(src)
    if dst.suffix != ".safetensors":
        _fresh(dst)
    params = {n: reader.full(n) for n in reader.names()}
    if dst.suffix == ".safetensors":
        write_weights(params, dst)
        return dst
    states = reader.manifest["optimizer"]["states"]
    tensors = dict(params)
    for s in states:
        tensors.update({f"optimizer/{s}/{n}": reader.full(f"optimizer/{s}/{n}") for n in params})
    m = reader.manifest
    return write_one_piece(tensors, dst, m["step"], m["optimizer"], m.get("config", {}), m.get("model"))


def inspect(path):
    """A report of a checkpoint or a weights file; every file's checksum is verified."""
    path = Path(path)
    if path.suffix == ".safetensors":
        weights = read_weights(path)
        lines = [f"{path}: consolidated weights, {len(weights)} tensors, "
                 f"{sum(w.size for w in weights.values()):,} parameters"]
        lines += [f"  {n:<32} {str(tuple(w.shape)):<16} {w.dtype}" for n, w in weights.items()]
        return "\n".join(lines)
    reader = open_checkpoint(path)
    m = reader.manifest
    for name in m["files"]:
        reader._file(name)                                  # verifies size and SHA-256
    lay = m["layout"]
    total = sum(_count(t["shape"]) for t in m["tensors"].values())
    cp = f" x cp {lay['cp']}" if lay.get("cp", 1) > 1 else ""
    lines = [f"{reader.dir}: step {m['step']}, written by tp {lay['tp']}{cp} x pp {lay['pp']} x dp {lay['dp']}",
             f"  optimizer {m['optimizer']['name']} (t = {m['optimizer']['t']}, state: "
             f"{', '.join(m['optimizer']['states']) or 'none'})",
             f"  {len(m['files'])} files, all checksums verified; {len(m['tensors'])} tensors, {total:,} parameters"]
    for name, t in m["tensors"].items():
        cut = f"dim {t['dim']} in {t['parts']} parts" + (f" (groups {t['groups']})" if t.get("groups", 1) > 1 else "") \
            if "parts" in t else "whole"
        lines.append(f"  {name:<32} {str(tuple(t['shape'])):<16} {t['dtype']:<8} {cut}")
    return "\n".join(lines)


def _count(shape):
    n = 1
    for s in shape:
        n *= s
    return n
