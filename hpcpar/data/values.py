"""The kinds of the values in a JSON file hpcpar reads (meta.json beside prepared tokens, a checkpoint's
config.json), each refused in one line when it is of another kind.
"""
import json
import math
from pathlib import Path

from hpcpar.runtime import UsageError


# what a value of a JSON file hpcpar reads must be: the test, and the words of the message
KINDS = {"count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
         "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                    "a finite number >= 0"),
         "bool": (lambda v: isinstance(v, bool), "true or false"),
         "text": (lambda v: isinstance(v, str), "a string"),
         "list": (lambda v: isinstance(v, list), "a list"),
         "object": (lambda v: isinstance(v, dict), "an object")}


def check_value(where, key, value, kind):
    """Refuse ``value`` unless it is of ``kind`` (a key of KINDS; "kind?" also allows null)."""
    if kind.endswith("?") and value is None:
        return
    holds, words = KINDS[kind.rstrip("?")]
    if not holds(value):
        raise UsageError(f"{where}: {key} must be {words}, not {value!r}")


def read_optional_json(path, what="", types=None):
    """The JSON object in ``path``, or {} when there is no such file; one line (``what`` first) when it is
    unreadable, not an object, or one of its keys in ``types`` ({key: kind of KINDS}) is of another kind."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{what}cannot read {path}: {err}") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{what}{path} must hold a JSON object, not {type(obj).__name__}")
    for key, kind in (types or {}).items():
        if key in obj:
            check_value(f"{what}{path}", key, obj[key], kind)
    return obj
