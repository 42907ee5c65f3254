"""One Markdown page: run the commands of its console blocks, compare, and build the corrected text."""
import os
import platform

from hpcpar.tools.quotes.blocks import CAPTION, Quote, blocks, caption, render
from hpcpar.tools.quotes.compare import Mismatch, align, has_machine_figures


def machine():
    """What the docs say made their timings: "a 2-core AMD EPYC"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"a {os.cpu_count()}-core {name}"


def check_block(session, block):
    """(quotes rewritten from fresh output, problems): a problem names the block, the command and what
    differs."""
    new, problems = [], []
    for q in block.quotes:
        _, lines = session.output(q.command)   # a failing command: its quote holds the error
        where = f"{block.where()}: $ {q.command}"
        try:
            output, differences = align(q.output, lines, block.relative)
        except Mismatch as err:
            problems.append(f"{where}\n  {err}; the output was:\n    " + "\n    ".join(lines[:40]))
            new.append(q)
            continue
        problems += [f"{where}\n  {d}" for d in differences]
        new.append(Quote(q.command, output))
    return new, problems


def _captioned(text, block):
    """Whether the line after the block's closing fence names the machine of its figures."""
    after = text.index("\n", block.end) if "\n" in text[block.end:] else len(text)
    return CAPTION.match(text, after) is not None


def check_page(session, path, slow=True):
    """(corrected text, problems, blocks checked) of the page at ``path``; ``slow=False`` leaves out
    the blocks marked slow.  A block with figures of the machine (timings, rates) must be followed by a
    caption naming the machine; a rewritten block gets one naming this machine."""
    text = open(path).read()
    pieces, problems, checked, pos = [], [], 0, 0
    for block in blocks(path, text):
        if block.slow and not slow:
            continue
        checked += 1
        quotes, found = check_block(session, block)
        shown = block.quotes if not found else quotes          # what the page will show
        figures = block.machine or has_machine_figures([line for q in shown for line in q.output])
        if not found and figures and not _captioned(text, block):
            found = [f"{block.where()}: figures of the machine without a caption naming the machine"]
            quotes = block.quotes                # the figures match: only the caption is added
        problems += found
        if not found:
            continue
        pieces.append(text[pos:block.start])
        pieces.append(render(quotes))
        fence_end = text.index("\n", block.end) + 1 if "\n" in text[block.end:] else len(text)
        pieces.append(text[block.end:fence_end].rstrip("\n"))
        pos = fence_end - 1
        old = CAPTION.match(text, pos)
        if old:
            pos = old.end() - 1
        if figures:
            pieces.append(caption(machine()).rstrip("\n"))
    pieces.append(text[pos:])
    return "".join(pieces), problems, checked
