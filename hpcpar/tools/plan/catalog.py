"""The planner's data files: shipped TOML profiles (hpcpar/tools/plan/hardware/, hpcpar/tools/plan/models/) and a
user's own, read the same way."""
from importlib import resources
from pathlib import Path

from hpcpar.runtime import UsageError

try:
    import tomllib
except ImportError:                      # Python 3.10: the same parser, from PyPI
    import tomli as tomllib


def names(folder):
    """Names of the shipped files in ``folder`` ("hardware" or "models")."""
    files = resources.files("hpcpar.tools.plan") / folder
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".toml"))


def read(spec, folder, what, choices_hint):
    """(mapping, name) of a path to a TOML file or a shipped name; one clear error otherwise."""
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise UsageError(f"{what} {spec} does not exist")
        with open(path, "rb") as fh:
            return tomllib.load(fh), path.stem
    if spec not in names(folder):
        raise UsageError(f"unknown {what} {spec!r}: use one of {', '.join(names(folder))}{choices_hint}")
    text = (resources.files("hpcpar.tools.plan") / folder / f"{spec}.toml").read_bytes().decode()
    return tomllib.loads(text), spec
