"""The ``console`` blocks of a Markdown file: their commands and quoted outputs, and writing them back."""
import re
from dataclasses import dataclass, field

from hpcpar.tools.quotes.compare import DRIFT, MACHINE_ONLY, RELATIVE

FENCE = re.compile(r"^```console(?P<flags>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
CAPTION = re.compile(r"\n<sub>Figures from a run on .*?</sub>\n", re.S)


@dataclass
class Quote:
    command: str          # as written after "$ ", continuation lines joined with their backslashes
    output: list          # the quoted lines under it, "..." where lines are left out


@dataclass
class Block:
    path: str
    line: int             # 1-based line of the opening fence
    start: int            # character offsets of the body in the file's text
    end: int
    slow: bool
    machine: bool         # every decimal depends on the machine (compare.py)
    drift: bool           # a long float32 run: decimals to compare.DRIFT
    quotes: list = field(default_factory=list)

    @property
    def relative(self):
        """How far this block's decimals may be from a fresh run's (compare.py)."""
        return MACHINE_ONLY if self.machine else DRIFT if self.drift else RELATIVE

    def where(self):
        return f"{self.path}:{self.line}"


def parse_body(body):
    """The quotes of one block body: each ``$`` command with the lines under it (blank ones trimmed)."""
    quotes, lines = [], body.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if quotes:
                quotes[-1].output.append(line)
            elif line.strip():
                raise ValueError(f"a console block starts with output, not a '$ ' command: {line!r}")
            i += 1
            continue
        command = [line[2:]]
        while command[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        quotes.append(Quote("\n".join(command), []))
        i += 1
    for q in quotes:
        while q.output and not q.output[-1].strip():
            q.output.pop()
    return quotes


def blocks(path, text=None):
    """Every console block of the Markdown file ``path``."""
    text = open(path).read() if text is None else text
    found = []
    for m in FENCE.finditer(text):
        flags = m.group("flags").split()
        block = Block(str(path), text.count("\n", 0, m.start()) + 1, m.start("body"), m.end("body"),
                      "slow" in flags, "machine" in flags, "drift" in flags)
        try:
            block.quotes = parse_body(m.group("body"))
        except ValueError as err:
            raise ValueError(f"{block.where()}: {err}") from None
        found.append(block)
    return found


def render(quotes):
    """A block body from its quotes: commands and outputs, a blank line between two commands when the
    first has output."""
    parts = []
    for i, q in enumerate(quotes):
        parts.append("$ " + q.command)
        parts.extend(q.output)
        if q.output and i < len(quotes) - 1:
            parts.append("")
    return "\n".join(parts) + "\n"


def caption(machine):
    return f"\n<sub>Figures from a run on {machine}; timings and rates differ on other machines.</sub>\n"
