"""The independent references, PyTorch and Hugging Face transformers: test-only, optional and large.

A test that compares against them calls ``need("torch")`` (or ``need("torch", "transformers")``) before
it touches them, never a bare ``import torch`` at the top of a file: without the package the test is
skipped with one reason that starts with REASON, and conftest.py counts those skips at the end of the
session and prints ENABLE, the one command that turns them on.
"""
import importlib.util

import pytest

REASON = "reference test"
ENABLE = ".venv/bin/pip install torch==2.13.0"
WHY_OPTIONAL = ("a local CPU build on the project's machines, elsewhere a download of gigabytes; "
                "transformers comes with `make install`")


def need(*modules):
    """Import ``modules`` in order (torch before transformers, which needs it) or skip; the last one."""
    found = None
    for name in modules:
        found = pytest.importorskip(name, reason=f"{REASON}: {name} is not installed ({ENABLE})")
    return found


def available(*modules):
    """Whether ``modules`` are all installed, for a test that runs its reference part only then."""
    return all(importlib.util.find_spec(name) for name in modules)
