"""A quoted output against a fresh one, with the tolerance a docs page needs to stay true on any machine.

Two lines match when their text is the same once every number is replaced by ``#`` (runs of spaces
count as one: a wider number shifts a column) and their numbers match pairwise:

* figures of the machine - a number with a time or rate unit (``ms``, ``s``, ``tokens/s``,
  ``GFLOP/s``, ...), the MFU, a *measured* or *simulated-from-measured* share, the share of a step
  inside MPI, the timing fields of a metrics line - are masked: any value matches;
* round-off: two numbers both below 1e-8 in size match (a relative difference of 1.5e-15 on one
  BLAS is 1.6e-15 on another);
* an integer (no decimal point) must be equal;
* in a block marked ``machine`` (a model fitted to this machine's measurements), every decimal is a
  figure of the machine;
* in a block marked ``drift`` (a float32 run of a thousand steps: every step's rounding depends on the
  CPU's BLAS kernels, and the run carries it on), a decimal must agree to 1e-2 relative - measured
  between an AMD EPYC and an Intel Xeon: 3.6e-4 on the loss after 1000 steps, 1.8e-3 on its
  gradient norm;
* any other decimal must agree to one unit of its last printed digit, or to 1e-4 relative (a float32
  loss after a few hundred steps on another CPU).
"""
import math
import re

NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
# a match of any of these covers the numbers inside it: they depend on the machine
MACHINE = re.compile("|".join([
    r"[-+]?[\d,.]+(?:[eE][-+]?\d+)?\s*(?:ns/step|ms/step|s/step|ns|ms|us|µs|s|sec|seconds|minutes|"
    r"tokens/s|tok/s|[GMT]FLOP/s|[GMK]B/s|GiB/s|MiB/s)(?![\w/])",
    r"MFU\s+[\d.]+%",
    r"measured [\d.]+%",
    r"simulated [\d.]+% for the measured",
    r"\([\d.]+% of the step\)",
    r'"(?:tokens_per_s|step_time_s)": [\d.eE+-]+',
]))
ROUND_OFF = 1e-8
RELATIVE = 1e-4
DRIFT = 1e-2
MACHINE_ONLY = math.inf          # a block of figures of the machine: any decimal matches


def skeleton(line):
    return " ".join(NUMBER.sub("#", line).split())


def _same_text(quoted, fresh):
    """Same skeleton; a quoted line that ends in "..." matches any line that starts the same way."""
    q, f = skeleton(quoted), skeleton(fresh)
    if q.endswith(" ...") and q != "...":
        return f.startswith(q[:-4])
    return q == f


def _masked(line):
    """Character spans of the machine-dependent figures in ``line``."""
    return [m.span() for m in MACHINE.finditer(line)]


def _value(text):
    return float(text.replace(",", ""))


def _last_digit(text):
    """One unit of the last printed digit of a decimal: 0.01 for "3.25", 1e-5 for "1.5e-4"."""
    mantissa, _, exponent = text.replace(",", "").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def numbers_match(quoted, fresh, relative=RELATIVE):
    """Why two number strings differ too much, or None when they match; ``relative``: how far two
    decimals may be apart, relative to the larger."""
    a, b = _value(quoted), _value(fresh)
    if abs(a) < ROUND_OFF and abs(b) < ROUND_OFF:
        return None
    if not _decimal(quoted + fresh):
        return None if a == b else f"{quoted} != {fresh}"
    tolerance = max(_last_digit(quoted), _last_digit(fresh), relative * max(abs(a), abs(b)))
    return None if abs(a - b) <= tolerance * (1 + 1e-9) else f"{quoted} != {fresh}"


def _decimal(text):
    return any(c in text for c in ".eE")


def line_difference(quoted, fresh, relative=RELATIVE):
    """Why a quoted line does not match a fresh one, or None when it does; ``relative``: the block's
    tolerance for decimals (RELATIVE, DRIFT or MACHINE_ONLY)."""
    if not _same_text(quoted, fresh):
        return "the text differs"
    qs, fs = list(NUMBER.finditer(quoted)), list(NUMBER.finditer(fresh))
    # the skeletons agree, so both lines hold the same numbers in the same places
    for q, f in zip(qs, fs):
        in_mask = any(s <= q.start() < e for s, e in _masked(quoted)) or \
            any(s <= f.start() < e for s, e in _masked(fresh))
        if in_mask:
            continue
        why = numbers_match(q.group(), f.group(), relative)
        if why:
            return why
    return None


def has_machine_figures(lines):
    return any(_masked(line) for line in lines)


class Mismatch(Exception):
    """A quote that no longer matches its command's output; the message says where and how."""


def _find(lines, target, start, relative):
    """The first line from ``start`` on that matches ``target`` with its numbers, else the first with its
    text (lines such as "step 1/5 ..." and "step 5/5 ..." differ only in their numbers)."""
    for j in range(start, len(lines)):
        if line_difference(target, lines[j], relative) is None:
            return j
    same = [j for j in range(start, len(lines)) if _same_text(target, lines[j])]
    if same:         # the one sharing the most numbers: "step 1000/1000" is not "step 200/1000"
        wanted = NUMBER.findall(target)
        return max(same, key=lambda j: (sum(a == b for a, b in zip(wanted, NUMBER.findall(lines[j]))), -j))
    raise Mismatch(f"quoted line not in the output: {target.strip()!r}")


def align(quoted, fresh, relative=RELATIVE):
    """The quote rewritten from ``fresh`` (the command's output lines): each run of quoted lines between
    ``...`` is replaced by the output lines from its first line to its last.  Returns (new quote, list of
    differences); raises Mismatch when a quoted line's text is nowhere in the output."""
    fresh = [line.rstrip() for line in fresh]
    while fresh and not fresh[-1].strip():
        fresh.pop()
    if not quoted:                       # an empty quote says the command prints nothing
        return fresh, ([f"the output has {len(fresh)} lines, the quote none"] if fresh else [])
    segments, current = [], []
    for line in quoted:
        if line.strip() == "...":
            segments.append(current)
            current = []
        else:
            current.append(line.rstrip())
    segments.append(current)
    new, differences, pos = [], [], 0
    for i, seg in enumerate(segments):
        if i:
            new.append("...")
        if not seg:
            continue
        first = 0 if i == 0 else _find(fresh, seg[0], pos, relative)
        if i == 0 and not _same_text(seg[0], fresh[0] if fresh else ""):
            # no "..." above the first quoted line: the quote starts where the output starts
            raise Mismatch(f"the output no longer starts with {seg[0].strip()!r}"
                           f" (it starts with {(fresh or [''])[0].strip()!r})")
        last = len(fresh) - 1 if i == len(segments) - 1 else _find(fresh, seg[-1], first, relative)
        part = fresh[first:last + 1]
        if len(part) != len(seg):
            differences.append(f"{len(seg)} quoted lines where the output has {len(part)}: "
                               f"{seg[0].strip()!r} ... {seg[-1].strip()!r}")
        else:
            for q, f in zip(seg, part):
                why = line_difference(q, f, relative)
                if why:
                    differences.append(f"{why}: quoted {q.strip()!r}, output {f.strip()!r}")
        new.extend(part)
        pos = last + 1
    return new, differences
