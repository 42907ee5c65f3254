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


# Above the engine (layers 0-4), the folders of hpcpar/: the tools, the teaching material the docs run, and
# the command line - so that ``ls hpcpar`` shows the engine and one tools folder.
ABOVE_THE_ENGINE = {"tools", "examples", "course", "cli"}


def test_ls_hpcpar_shows_the_engine_and_one_tools_folder():
    above = {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and (PACKAGE / m.split(".")[1]).is_dir()
             and layer(m) > 4}
    assert above == ABOVE_THE_ENGINE, f"folders of hpcpar/ above the engine: {sorted(above)} (a tool goes into tools/)"
    for folder in ABOVE_THE_ENGINE:
        low = sorted(m for m in MODULES if covers(f"hpcpar.{folder}", m) and layer(m) <= 4)
        assert not low, f"hpcpar/{folder}/ holds modules of the engine's layers: {low}"


def floor(module):
    """The top-level entry of hpcpar/ a module lies in (its folder, or the loose module itself)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


FLOORS = {}
for _m in MODULES:
    FLOORS[floor(_m)] = max(FLOORS.get(floor(_m), 0), layer(_m) or 0)


def test_no_arrow_runs_back_up():
    """Drawn floor by floor - each folder on the highest layer of its modules - no import runs from a folder
    to one on a higher floor (a folder that spans two floors, as trace/ once spanned the tracer and the
    reports, would draw the arrows from below it as arrows back up)."""
    up = sorted(f"{m} ({floor(m)}, floor {FLOORS[floor(m)]}) imports {t} ({floor(t)}, floor {FLOORS[floor(t)]})"
                for m, targets in EDGES.items() for t in targets
                if t in MODULES and floor(t) != floor(m) and FLOORS[floor(t)] > FLOORS[floor(m)])
    assert not up, "\n".join(up)


README = ROOT / "README.md"


def readme_table():
    """[(idea, path, [names])] of the README's "Where each idea lives" table."""
    text = README.read_text().split("## Where each idea lives", 1)[1]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`hpcpar/"):
            rows.append((cells[0], cells[1].strip("`"), re.findall(r"`([\w.]+)`", cells[2])))
    return rows


def defined(path):
    """The names a file defines at its top level and, as ``Class.name``, in its classes."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef))
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


# what the front door must lead to: every parallelism and the newer ideas (a row whose idea names it)
FRONT_DOOR = ("grid", "f and g", "column split", "schedule", "send", "flat buffer", "ZeRO-3 gather", "HSDP",
              "ring attention", "Ulysses", "expert dispatch", "training step", "document mask", "latent attention",
              "FP8 quantiser", "GEMM provider", "ULFM")


def test_the_readme_table_leads_into_the_code():
    rows = readme_table()
    missing = [idea for idea in FRONT_DOOR if not any(idea in row[0] for row in rows)]
    assert not missing, f"the README's table has no row for: {missing}"
    for idea, path, names in rows:
        assert (ROOT / path).is_file(), f"README: {idea}: {path} does not exist"
        assert names, f"README: {idea}: name a function or class of {path}"
        absent = [n for n in names if n not in defined(ROOT / path)]
        assert not absent, f"README: {idea}: {path} defines no {absent}"


def test_the_readme_names_every_parallelism_first():
    first = README.read_text().split("\n\n")[1]
    for word in ("tensor", "sequence", "pipeline", "data", "ZeRO", "HSDP", "context", "ring", "Ulysses", "expert"):
        assert word in first, f"README's first paragraph does not name {word}"
    reading = (PACKAGE / "__init__.py").read_text()
    for folder in ("comm/grid.py", "tensor_parallel/", "pipeline/", "data_parallel/", "context_parallel/",
                   "expert_parallel/", "training/"):
        assert folder in reading, f"hpcpar/__init__.py's reading order leaves out {folder}"
    assert "3D" not in reading


LONGEST = 300          # lines of a file of hpcpar/, unless docs/architecture.md names it with its reason


def named_long_files():
    """{path: reason} of the map's section "Files over 300 lines" (rows ``* `hpcpar/x.py`: why``)."""
    section = MAP.read_text().split("## Files over 300 lines", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\* `(hpcpar/[\w/]+\.py)`: (.+)$", section, re.M))


def test_files_stay_under_300_lines_unless_the_map_says_why():
    named = named_long_files()
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = sorted(f"{path} ({n} lines)" for path, n in lines.items() if n > LONGEST and path not in named)
    assert not long, "cut these along their ideas, or name them with the reason in docs/architecture.md:\n" + \
        "\n".join(long)
    stale = sorted(path for path in named if lines.get(path, 0) <= LONGEST)
    assert not stale, f"docs/architecture.md names files that are not over {LONGEST} lines: {stale}"
