"""The package's import graph against its map (docs/architecture.md): layers, no cycles, no MPI below.

Pure Python: every ``import`` of every module under hpcpar/ is read with ``ast`` - also the ones inside
functions, which run just as surely when the function is called - and nothing is imported.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hpcpar"
MAP = ROOT / "docs" / "architecture.md"

# Never MPI, not even through another module: the math a student reads on its own (the map's layers 0
# and 1 hold them; named here too, so that editing the map cannot let them slip).
NO_MPI = ("hpcpar.ops", "hpcpar.nn", "hpcpar.pipeline.schedules", "hpcpar.pipeline.simulate", "hpcpar.optim",
          "hpcpar.data")
MPI = ("mpi4py", "hpcpar.comm")
CLI = "hpcpar.cli"
ENTRY_POINT = "hpcpar.__main__"         # ``python -m hpcpar`` is the command line, so it imports it


def module_names():
    """{dotted name: path} of every module of the package (a package by its __init__.py)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = module_names()


def imported_names(name, path):
    """Every dotted name ``name`` imports (absolute; ``from a import b`` gives a.b, or a when b is not a
    module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return out


def owner(dotted):
    """The module of the package a dotted name lives in (None outside the package)."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def graph():
    """{module: set of package modules and external top-level names it imports directly}."""
    edges = {}
    for name, path in MODULES.items():
        targets = set()
        for dotted in imported_names(name, path):
            if dotted.split(".")[0] != "hpcpar":
                targets.add(dotted.split(".")[0])
            elif owner(dotted) != name:
                targets.add(owner(dotted))
        edges[name] = targets
    return edges


EDGES = graph()


def reached(start):
    """Everything importing ``start`` runs: its imports, theirs, ..., and the __init__ of every package
    on the way (importing a.b.c first runs a/__init__.py and a/b/__init__.py)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        for target in EDGES.get(name, set()) | parents(name):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def parents(name):
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def covers(entry, module):
    """A map entry holds itself and, for a package, its modules; the root ``hpcpar`` only its __init__."""
    return module == entry or (entry != "hpcpar" and module.startswith(entry + "."))


def read_map():
    """{entry: layer} from the map's table of layers (rows ``| N | what | `hpcpar.x`, ... |``)."""
    layers = {}
    for line in MAP.read_text().splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|(.*)\|(.*)\|\s*$", line)
        if row:
            for entry in re.findall(r"`([\w.]+)`", row[3]):
                assert entry not in layers, f"docs/architecture.md names {entry} twice"
                layers[entry] = int(row[1])
    return layers


LAYERS = read_map()


def layer(module):
    """The layer of the most specific map entry that covers ``module``."""
    entries = [e for e in LAYERS if covers(e, module)]
    return LAYERS[max(entries, key=len)] if entries else None


def test_the_map_has_layers_and_names_only_real_modules():
    assert sorted(set(LAYERS.values())) == list(range(max(LAYERS.values()) + 1)), "layers are numbered 0, 1, ..."
    stale = [e for e in LAYERS if e not in MODULES]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_every_module_is_on_the_map():
    missing = sorted(m for m in MODULES if layer(m) is None)
    assert not missing, f"add these modules to the table in docs/architecture.md: {missing}"


def test_no_module_imports_a_higher_layer():
    upward = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                    for m, targets in EDGES.items() for t in targets if t in MODULES and layer(t) > layer(m))
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    """Depth-first search; a package's __init__ importing its own modules is not a cycle by itself."""
    state, cycles = {}, []

    def visit(name, path):
        state[name] = "open"
        for target in sorted(t for t in EDGES[name] if t in MODULES):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[name] = "done"

    for name in sorted(MODULES):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("prefix", NO_MPI)
def test_the_math_never_reaches_mpi(prefix):
    for name in (m for m in MODULES if covers(prefix, m)):
        bad = sorted(t for t in reached(name) if any(covers(p, t) for p in MPI))
        assert not bad, f"{name} imports {bad}, directly or through other modules"


def test_the_map_keeps_the_math_below_mpi():
    """The map's layers 0 and 1 are the ones that never reach MPI; the named modules are among them,
    and so is every module the map puts there."""
    comm = layer("hpcpar.comm")
    assert comm == 2 and all(layer(m) < comm for p in NO_MPI for m in MODULES if covers(p, m))
    for name in (m for m in MODULES if layer(m) < comm):
        bad = sorted(t for t in reached(name) if any(covers(p, t) for p in MPI))
        assert not bad, f"{name} (layer {layer(name)} on the map) reaches {bad}"


def test_only_the_command_line_imports_the_command_line():
    assert layer(CLI) == max(LAYERS.values()) == layer(ENTRY_POINT)
    outside = sorted(f"{m} imports {t}" for m, targets in EDGES.items() for t in targets
                     if covers(CLI, t) and not covers(CLI, m) and m != ENTRY_POINT)
    assert not outside, "\n".join(outside)


def test_the_root_holds_only_the_ground_floor():
    """``ls hpcpar`` is the map: above layers 0 and 1 every module lives in a folder named on the map."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 14, f"{len(loose)} loose modules in hpcpar/ (at most 14): {loose}"
    high = sorted(m for m in MODULES if m.count(".") == 1 and m != ENTRY_POINT
                  and not (PACKAGE / m.split(".")[1]).is_dir() and layer(m) > 1)
    assert not high, f"modules above layer 1 lying loose in hpcpar/ (move them into their layer's folder): {high}"
    files = sorted(e for e in LAYERS if e not in ("hpcpar", ENTRY_POINT) and e.count(".") == 1
                   and not (PACKAGE / e.split(".")[1]).is_dir() and LAYERS[e] > 1)
    assert not files, f"the map names loose modules above layer 1 instead of folders: {files}"
