"""A checkpoint's manifest: what it records, and what a resume checks against it.

The manifest records the layout that wrote the step, the options, the run that wrote it (``run``: its
id, continued by a --resume; rotation deletes only a run's own steps), the resolved model - every
dimension and trait, not the preset's zeros - the optimizer, and every tensor and file.  A resume is
refused, with one line naming both values, when anything the weights or their meaning depend on
differs: the model (``MODEL``), the optimizer, the dtype, or the set of tensors (one missing, one
extra, one of another shape).  A deliberate change of model goes through ``hpcpar checkpoint convert``
and ``--init-from``.
"""
from hpcpar.checkpoint.directory import folder_step
from hpcpar.checkpoint.files import FORMAT, CheckpointError
from hpcpar.runtime import UsageError

# (manifest key, the model config's attribute, the flag that sets it) of a GPT; the MLP's below
MODEL = (("family", "arch", "--model"), ("layers", "n_layer", "--layers"), ("hidden", "d_model", "--hidden"),
         ("heads", "n_head", "--heads"), ("kv_heads", "n_kv_head", "--kv-heads"),
         ("head_dim", "head_size", "--head-dim"), ("ffn", "d_ff", "--ffn"), ("vocab", "vocab_size", "--vocab"),
         ("positions", "n_positions", "--positions"), ("tied", "tied", "--untied"),
         ("experts", "n_expert", "--experts"), ("top_k", "top_k", "--top-k"),
         ("shared_experts", "n_shared_expert", "--shared-experts"), ("qk_norm", "qk_norm", "--model"),
         ("router_score", "router_score", "--router-score"), ("norm_topk", "norm_topk", "--no-norm-topk"),
         ("ln_eps", "ln_eps", "--ln-eps"), ("rope_theta", "rope_theta", "--rope-theta"))
MLP = (("family", None, "--model"), ("layers", "n_layer", "--layers"), ("hidden", "d_model", "--hidden"),
       ("ffn", "d_ff", "--ffn"), ("inputs", "d_in", None), ("outputs", "d_out", None))


def _facts(mcfg):
    return MLP if not hasattr(mcfg, "arch") else MODEL


def model_record(mcfg):
    """The resolved model of a run, as the manifest records it."""
    return {key: ("mlp" if attr is None else getattr(mcfg, attr)) for key, attr, _ in _facts(mcfg)}


def manifest(trainer, step, layouts, files, state_names, run=None):
    cfg = trainer.cfg
    tensors = {}
    for rank_file, layout in layouts:
        for name, (shard, full_shape, dtype) in layout.items():
            entry = tensors.setdefault(name, {"shape": list(full_shape), "dtype": dtype, "files": {}})
            part = 0 if shard is None else shard.index
            if shard is not None:
                entry.update(dim=shard.dim, parts=shard.parts, groups=shard.groups)
            entry["files"][str(part)] = rank_file
    return {
        "format": FORMAT,
        "step": step,
        "run": run,
        "layout": {"tp": cfg.tp, "cp": cfg.cp, "pp": cfg.pp, "dp": cfg.dp, "schedule": cfg.schedule,
                   "microbatches": cfg.microbatches, "chunks": cfg.chunks, "zero": cfg.zero,
                   "sequence_parallel": cfg.sequence_parallel},
        "config": {k: v for k, v in vars(cfg).items()},
        "model": model_record(trainer.mcfg),
        "optimizer": {"name": cfg.optimizer, "t": trainer.optimizer.t, "states": list(state_names)},
        "loss_scale": {"scale": trainer.scaler.scale, "good_steps": trainer.scaler.good_steps},
        "tensors": tensors,
        "files": files,
    }


def check_manifest(m, step_dir):
    """A manifest that is not an hpcpar checkpoint's, lacks what a reader needs, or says another step than
    its folder is refused (its step would be believed: the run would go on at the wrong step)."""
    where = step_dir / "manifest.json"
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an hpcpar checkpoint (format "
                              f"{m.get('format') if isinstance(m, dict) else None!r})")
    for key, kind in (("step", int), ("tensors", dict), ("files", dict), ("optimizer", dict), ("layout", dict)):
        if not isinstance(m.get(key), kind) or isinstance(m.get(key), bool):
            raise CheckpointError(f"{where} lacks a valid {key!r}")
    folder = folder_step(step_dir)
    if folder is not None and folder != m["step"]:
        raise CheckpointError(f"{where} says step {m['step']} but its folder is step {folder}: the manifest "
                              f"was altered or moved")


def check_resume(m, step_dir, trainer, names):
    """Refuse to resume this run from manifest ``m`` unless it is the same model trained the same way.
    ``names``: every parameter name of the whole model (all ranks')."""
    cfg, mcfg = trainer.cfg, trainer.mcfg
    saved = m.get("model")
    if saved:                                  # (a checkpoint from before the record: its tensors decide)
        mine = model_record(mcfg)
        for key, _, flag in _facts(mcfg):
            if saved.get(key) != mine[key]:
                how = f" ({flag})" if flag else ""
                raise UsageError(f"{step_dir} holds another model: {key} = {saved.get(key)} there, {mine[key]} in "
                                 f"this run{how}; resume it with the same model (to start another model from its "
                                 f"weights: hpcpar checkpoint convert, then --init-from)")
    theirs = m["optimizer"].get("name")
    if theirs and theirs != cfg.optimizer:
        raise UsageError(f"{step_dir} was written with --optimizer {theirs}; this run has --optimizer "
                         f"{cfg.optimizer}: resume with the same optimizer")
    saved_dtype = m.get("config", {}).get("dtype")
    if saved_dtype and saved_dtype != cfg.dtype:
        raise UsageError(f"{step_dir} was written in {saved_dtype}; this run is {cfg.dtype} "
                         "(convert it first: hpcpar checkpoint convert)")
    tensors = m["tensors"]
    for what, odd in (("no", sorted(set(names) - set(tensors))),
                      ("a tensor this model does not have:", sorted(set(tensors) - set(names)))):
        if odd:
            raise UsageError(f"{step_dir} holds a different model: {what} {odd[0]}"
                             + (f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""))
    for p in trainer.parameters():
        if tuple(tensors[p.name]["shape"]) != p.full_shape:
            raise UsageError(f"{step_dir} holds a different model: {p.name} is {tuple(tensors[p.name]['shape'])} "
                             f"there and {p.full_shape} here")
