"""A layout: how one training step is split over the GPUs, written as one string.

    tp8-pp8-dp16-mb1-v1-1f1b[-cp2[-ulysses]][-ep8][-sp][-z1|-z2|-z3[-hs4]][-rcsel|-rcfull]

    tpT    tensor-parallel size (ranks sharing every layer)
    ppP    pipeline stages
    dpD    data-parallel replicas                           T * C * P * D = number of GPUs
    cpC    context-parallel size: each of C ranks holds 1/C of every sequence (ring attention)
    ulysses  context parallelism by two all-to-alls around attention (Ulysses) instead of the ring
    epE    expert parallelism: each mixture-of-experts layer's experts spread over E consecutive ranks
           of the D * C ranks (docs/moe.md); tokens reach them by all-to-all (tools/plan/experts.py)
    mbB    micro-batch size in sequences; the number of micro-batches is m = global batch / (D * B)
    vV     model chunks per stage (V > 1 only for the chunked schedules: interleaved, and the V
           schedules zb-v and dualpipev, which place exactly 2 chunks per rank)
    name   pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, dualpipev
    sp     sequence parallelism (LayerNorm/dropout activations sharded over TP as well)
    zK     ZeRO stage K over the DP (x CP) ranks: z1 shards the optimizer state, z2 the gradients as
           well, z3 (FSDP) the weights too (gathered layer by layer when needed)
    hsN    HSDP: ZeRO shards over groups of N dp ranks (x cp) - inside a node, when they fit - and
           replicates across the D / N groups (reduce-scatter and gather inside, all-reduce across)
    rcsel  selective recomputation (attention scores recomputed), rcfull: every layer recomputed

Layers go to stages as the engine cuts them (``stage_layers``, pipeline/partition.py): hpcpar's
engine evenly with the remainder on the first stages, the published engines with the remainder on the
middle stages first, because the first stage also holds the embedding and the last the head (BLOOM's
5+6*10+5 split of 70 layers, Llama 3's 7+8*14+7 of 126).  A rank's layers are those of the virtual
stages its schedule places on it, and the ends sit where the placement puts them (``pipeline_ends``).
"""
from dataclasses import dataclass, replace
from functools import lru_cache

from hpcpar.data_parallel.zero_memory import shard_size
from hpcpar.pipeline.partition import partition
from hpcpar.pipeline.actions import ends, holders
from hpcpar.pipeline.schedules import KINDS, SCHEDULES
from hpcpar.runtime import UsageError

RECOMPUTE = {"": "none", "rcsel": "selective", "rcfull": "full"}


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    mb: int = 1
    v: int = 1
    schedule: str = "1f1b"
    recompute: str = "none"     # none | selective | full
    zero: int = 0               # ZeRO stage 0-3 (3: FSDP)
    sp: bool = False
    cp: int = 1                 # context-parallel size
    cp_kind: str = "ring"       # ring | ulysses: how the cp ranks attend (docs/context_parallel.md)
    ep: int = 1                 # expert-parallel size, taken from the dp * cp ranks (docs/moe.md)
    dp_shard: int = 0           # HSDP: ZeRO's shard groups of this many dp ranks (0: all of dp)

    def __post_init__(self):
        object.__setattr__(self, "zero", int(self.zero))     # zero=True reads as stage 1

    def __str__(self):
        text = f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.mb}-v{self.v}-{self.schedule}"
        if self.cp > 1:
            text += f"-cp{self.cp}" + ("-ulysses" if self.cp_kind == "ulysses" else "")
        if self.ep > 1:
            text += f"-ep{self.ep}"
        if self.sp:
            text += "-sp"
        if self.zero:
            text += f"-z{self.zero}"
        if self.dp_shard:
            text += f"-hs{self.dp_shard}"
        tag = {v: k for k, v in RECOMPUTE.items()}[self.recompute]
        return text + (f"-{tag}" if tag else "")

    @property
    def gpus(self):
        return self.tp * self.cp * self.pp * self.dp

    @property
    def replicas(self):
        """Ranks that hold the same weights: DP and CP ranks; gradients are summed over them."""
        return self.dp * self.cp

    @property
    def shard(self):
        """Ranks that ZeRO shards model state over: every replica, or HSDP's shard group."""
        return shard_size(self.dp, self.cp, self.dp_shard)

    @property
    def across(self):
        """HSDP: the shard groups, which each own range is all-reduced over (1 without HSDP)."""
        return self.replicas // self.shard

    @property
    def expert_shard(self):
        """Ranks the routed experts' state is sharded over: the shard group's ranks holding the same
        experts (one when ep spans the shard group)."""
        return max(1, self.shard // self.ep)

    def grid(self):
        """(tp, cp, pp, dp): the part of a layout that decides where every rank sits."""
        return self.tp, self.cp, self.pp, self.dp

    def with_(self, **changes):
        return replace(self, **changes)


def parse_layout(text):
    """Parse the string form above (order of the optional tags is free)."""
    parts = text.strip().lower().split("-")
    numbers, flags = {}, {"sp": False, "zero": 0, "recompute": "none", "schedule": None, "cp_kind": "ring"}
    # a schedule's name may contain the separator ("zb-h1"): only a whole name counts, the longest first
    for name in sorted(SCHEDULES, key=lambda n: -n.count("-")):
        k = name.count("-") + 1
        at = [i for i in range(len(parts) - k + 1) if "-".join(parts[i:i + k]) == name]
        if at:
            flags["schedule"] = name
            del parts[at[0]:at[0] + k]
            break
    for part in parts:
        if part == "sp":
            flags["sp"] = True
        elif part == "ulysses":
            flags["cp_kind"] = "ulysses"
        elif part in ("z1", "z2", "z3"):
            flags["zero"] = int(part[1])
        elif part in RECOMPUTE and part:
            flags["recompute"] = RECOMPUTE[part]
        else:
            key = part.rstrip("0123456789")
            value = part[len(key):]
            if key not in ("tp", "pp", "dp", "mb", "v", "cp", "ep", "hs") or not value:
                raise UsageError(f"layout {text!r}: cannot read {part!r} (expected e.g. "
                                 f"tp8-pp8-dp16-mb1-v1-1f1b, schedules {', '.join(SCHEDULES)}; see hpcpar plan --help)")
            numbers[key] = int(value)
    missing = [k for k in ("tp", "pp", "dp") if k not in numbers]
    if missing:
        raise UsageError(f"layout {text!r}: missing {', '.join(missing)}")
    return Layout(tp=numbers["tp"], pp=numbers["pp"], dp=numbers["dp"], mb=numbers.get("mb", 1),
                  v=numbers.get("v", 1), schedule=flags["schedule"] or "1f1b", recompute=flags["recompute"],
                  zero=flags["zero"], sp=flags["sp"], cp=numbers.get("cp", 1), cp_kind=flags["cp_kind"],
                  ep=numbers.get("ep", 1), dp_shard=numbers.get("hs", 0))


@lru_cache(maxsize=None)
def stage_layers(layers, pp, method="ends-light", schedule="1f1b", v=1):
    """Layers per pipeline rank as an engine cuts them: pp * v virtual stages (pipeline/partition.py's
    ``method``: hpcpar's engine "uniform", the published engines "ends-light" - ``Engine.partition``),
    each rank holding the virtual stages its schedule places there (round robin, or a V's r and 2p-1-r)."""
    counts = [len(r) for r in partition(layers, pp * v, method)]
    per_rank = [0] * pp
    for stage, (rank, _) in holders(KINDS[schedule].placement, pp, v).items():
        per_rank[rank] += counts[stage]
    return tuple(per_rank)


@lru_cache(maxsize=None)
def pipeline_ends(schedule, pp, v):
    """(the pipeline rank holding the embedding, the one holding the head and the loss): the schedule's
    placement (schedules.ends) - the last rank, or rank 0 for both under a V."""
    return ends(KINDS[schedule].placement, pp, v)


@lru_cache(maxsize=None)
def stage_classes(layers, pp, method="ends-light", schedule="1f1b", v=1):
    """Per pipeline rank, (its layers, whether it holds the embedding, whether it holds the head): all a
    rank's work and model state depend on, so ranks alike in these (a pipeline's middle stages) are
    worked out once."""
    first, last = pipeline_ends(schedule, pp, v)
    return tuple((n, i == first, i == last)
                 for i, n in enumerate(stage_layers(layers, pp, method, schedule, v)))


def by_class(keys, work, done=None):
    """[work(i) for each pipeline rank i], worked out once per distinct ``keys[i]`` (a stage class:
    ranks alike share one result); ``done``: a dict kept across calls (a search's), else a new one."""
    done = {} if done is None else done
    out = []
    for i, key in enumerate(keys):
        if key not in done:
            done[key] = work(i)
        out.append(done[key])
    return out
