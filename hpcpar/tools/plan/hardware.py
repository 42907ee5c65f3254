"""Hardware profiles: what one GPU (or CPU rank) and its two classes of links can do.

A profile is a TOML file (``hpcpar/tools/plan/hardware/*.toml`` or your own, e.g. from ``hpcpar plan
calibrate``); every number in the shipped ones names its source.  Two kinds of rate:

* peak numbers from the vendor (FLOP/s per dtype, HBM bytes and bandwidth, link bandwidths), and
* *efficiencies*: the share of a peak that real kernels sustain, by size class.  A GEMM of F FLOPs
  runs at ``peak * gemm_efficiency(F) * calibration``; a memory-bound pass over N bytes at
  ``hbm_bandwidth * memory_efficiency(N)``; a link moves data at ``bandwidth * efficiency``.

The size classes are steps: ``[[threshold, fraction], ...]`` - the fraction of the largest threshold
not above the size applies (thresholds in GFLOP for GEMMs, in MB for memory passes).
"""
from dataclasses import dataclass, field

from hpcpar.tools.plan import catalog
from hpcpar.runtime import UsageError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


@dataclass(frozen=True)
class Link:
    """One class of link in the alpha-beta model: a message of n bytes takes alpha + n / (beta * eff)."""
    bandwidth: float     # bytes/s, one direction, per GPU
    latency: float       # seconds per message (alpha)
    efficiency: float    # share of the bandwidth that collectives reach

    def seconds(self, nbytes):
        return self.latency + nbytes / (self.bandwidth * self.efficiency)


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: dict          # dtype -> FLOP/s of dense matrix math
    memory_bytes: float       # device memory per GPU
    reserved_bytes: float     # taken by the runtime (context, communication buffers, fragmentation)
    hbm_bandwidth: float      # bytes/s
    gemm_classes: tuple       # ((gflop threshold, fraction), ...)
    memory_classes: tuple     # ((MB threshold, fraction), ...)
    calibration: float        # one factor on every GEMM rate (1.0: none); see hpcpar/tools/plan/calibrate.py
    intra: Link               # inside a node (NVLink/NVSwitch; shared memory for a CPU profile)
    inter: Link               # across nodes (InfiniBand)
    gpus_per_node: int
    description: str = ""
    engine: dict = field(default_factory=dict)   # hpcpar's own costs here ([engine]: calibrate.py, cpu.py)

    def peak(self, dtype):
        if dtype not in self.peak_flops:
            raise UsageError(f"hardware {self.name} has no peak rate for {dtype} "
                             f"(it has {', '.join(sorted(self.peak_flops))})")
        return self.peak_flops[dtype]

    def gemm_rate(self, flops, dtype):
        """Sustained FLOP/s of one GEMM of ``flops`` FLOPs."""
        return self.peak(dtype) * step_lookup(self.gemm_classes, flops / 1e9) * self.calibration

    def memory_seconds(self, nbytes):
        """Time of a memory-bound pass that reads and writes ``nbytes`` in total."""
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.hbm_bandwidth * step_lookup(self.memory_classes, nbytes / 1e6))

    @property
    def usable_bytes(self):
        return self.memory_bytes - self.reserved_bytes


def step_lookup(classes, size):
    """The fraction of the largest threshold <= size (the smallest class below every threshold)."""
    best = classes[-1][1]
    for threshold, fraction in sorted(classes):
        if size >= threshold:
            best = fraction
    return best


def presets():
    """Names of the shipped hardware profile files."""
    return catalog.names("hardware")


def _link(d, what):
    try:
        return Link(bandwidth=float(d["bandwidth_GBps"]) * 1e9, latency=float(d["latency_us"]) * 1e-6,
                    efficiency=float(d.get("efficiency", 1.0)))
    except KeyError as err:
        raise UsageError(f"hardware profile: [{what}] needs {err.args[0]}") from None


def from_mapping(d, name):
    try:
        return Hardware(
            name=d.get("name", name),
            description=d.get("description", ""),
            peak_flops={k: float(v) * 1e12 for k, v in d["peak_tflops"].items()},
            memory_bytes=float(d["memory_GiB"]) * 2**30,
            reserved_bytes=float(d.get("reserved_GiB", 0)) * 2**30,
            hbm_bandwidth=float(d["memory_bandwidth_GBps"]) * 1e9,
            gemm_classes=tuple(tuple(c) for c in d["gemm_efficiency"]),
            memory_classes=tuple(tuple(c) for c in d["memory_efficiency"]),
            calibration=float(d.get("calibration", 1.0)),
            intra=_link(d["intra_node"], "intra_node"),
            inter=_link(d["inter_node"], "inter_node"),
            gpus_per_node=int(d.get("gpus_per_node", 8)),
            engine=d.get("engine", {}),
        )
    except KeyError as err:
        raise UsageError(f"hardware profile {name}: missing {err.args[0]}") from None


def load_hardware(spec):
    """A preset name (a100, h100, h200, h800) or a path to a profile TOML -> Hardware."""
    mapping, name = catalog.read(spec, "hardware", "hardware profile", " or a .toml profile")
    return from_mapping(mapping, name)
