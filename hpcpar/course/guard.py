"""The reference out of reach: a student's file runs with the package's answer to its exercise hidden.

Every exercise names the modules that hold its answer (``Exercise.hidden``: LossScaler's
hpcpar/precision.py for the loss-scale rule, say), and every exercise hides ``hpcpar.course`` itself,
whose checks hold the references.  ``load`` runs the student's file with an ``__import__`` of its own
(its module's builtins; every function of the file imports through it, then and later) that refuses

* a hidden module, or a module inside one:      import hpcpar.precision
* a name whose object a hidden module defines:  from hpcpar.training.step import precision
                                                (a re-export is the same object)
* the way round an import statement:            importlib, sys (sys.modules), builtins

and hands back every hpcpar module behind a proxy that refuses the same names as attributes
(``import hpcpar; hpcpar.precision.LossScaler``).  A refusal is an ImportError (``Hidden``) whose
message says why; the check reports it as the exercise's verdict.

This is a fence that keeps an honest student from copying the answer by accident or by shortcut,
not a sandbox: Python offers other ways round it, and a teacher who grades a class reads the code
that passes (docs/course/teaching.md).
"""
import builtins
import importlib.util
import types
from pathlib import Path

ALWAYS = ("hpcpar.course",)                 # the checks and their references
BARRED = ("importlib", "sys", "builtins")   # each reaches any module without an import statement


class Hidden(ImportError):
    """An import the exercise refuses: it would hand the student the reference."""


def _inside(name, modules):
    return any(name == m or name.startswith(m + ".") for m in modules)


def _hidden_object(obj, modules):
    if isinstance(obj, (types.ModuleType, _Proxy)):
        return _inside(_name(obj), modules)
    home = getattr(obj, "__module__", None)
    return isinstance(home, str) and _inside(home, modules)


def _name(module):
    return object.__getattribute__(module, "_module").__name__ if isinstance(module, _Proxy) else module.__name__


class _Proxy:
    """An hpcpar module as the student's code sees it: every attribute but the hidden ones."""

    def __init__(self, module, refuse):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_refuse", refuse)

    def __getattr__(self, attr):
        module, refuse = object.__getattribute__(self, "_module"), object.__getattribute__(self, "_refuse")
        obj = getattr(module, attr)
        refuse(f"{module.__name__}.{attr}", obj)
        return _Proxy(obj, refuse) if isinstance(obj, types.ModuleType) else obj

    def __setattr__(self, attr, value):
        raise Hidden(f"your exercise file may not change {_name(self)}.{attr}")

    def __repr__(self):
        return f"<module {_name(self)!r} as an exercise sees it>"


def importer(modules, exercise="this exercise"):
    """An ``__import__`` that refuses ``modules`` (and hpcpar.course) and their objects."""
    modules = tuple(modules) + ALWAYS
    real = builtins.__import__

    def refuse(what, obj=None):
        if obj is None and not (_inside(what, modules) or _inside(what, BARRED)):
            return
        if obj is not None and not _hidden_object(obj, modules):
            return
        if _inside(what, BARRED):
            why = "it reaches modules without an import statement, and this exercise hides some"
        else:
            home = _name(obj) if isinstance(obj, (types.ModuleType, _Proxy)) else \
                getattr(obj, "__module__", what) if obj is not None else what
            why = f"{home} holds the package's answer to {exercise}, which the check compares yours with"
        raise Hidden(f"import of {what} refused: {why} - write it yourself (the lesson and --hint help)")

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            refuse(name)
        module = real(name, globals, locals, fromlist, level)
        for attr in fromlist or ():
            if attr != "*" and hasattr(module, attr):
                refuse(f"{module.__name__}.{attr}", getattr(module, attr))
        if module.__name__.split(".")[0] == "hpcpar":
            return _Proxy(module, refuse)
        return module
    return guarded


def load(path, hidden=(), exercise="this exercise"):
    """The student's file at ``path`` as a module, run with ``hidden`` (and hpcpar.course) out of
    reach; raises Hidden on a refused import."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = dict(vars(builtins), __import__=importer(hidden, exercise))
    spec.loader.exec_module(module)
    return module
