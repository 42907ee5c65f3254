"""BENCHMARKS.md from the driver's report: the machine, the command, the targets, a table per benchmark."""

READING = """\
How to read the tables: the machine is shared (two cores, other jobs running), so every comparison
is measured **side by side in the same run**, the candidates taking turns round after round in a
rotating order; a table shows each candidate's **best round** and the **ratio** of the best rounds
(ours / theirs: below 1.00x we are faster, above we are slower; for bandwidths ours / raw, above
0.95x meets the target).  Rows against PyTorch quote the **median of at least 5 per-round ratios with
their range** (lowest-highest): a range that straddles a target means this run cannot tell.  The
machine table names the CPU's SIMD flags and its measured GEMM rate: compare those first when a ratio
differs from another machine's.  Serial benchmarks count CPU seconds of the process, which other jobs taking
the core away do not inflate; MPI benchmarks count wall seconds of the slowest rank.  Absolute times
move by 5-20% from run to run here; the ratios move much less.  bench/results.json holds every
figure, including the median of the per-round ratios."""


def _table(columns, rows):
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _targets(report):
    rows = []
    for name, bench in report["benchmarks"].items():
        for run in bench["runs"]:
            for t in run.get("targets", []):
                rows.append([f"({bench['label']}) {t['what']}", t["goal"], t["value"],
                             "met" if t["met"] else "**missed**"])
    return rows


def markdown(report):
    out = ["# hpcpar benchmarks", "",
           f"Produced by `{report['command']}` on {report['date']} in {report['seconds']:.0f} s"
           + (" (quick mode: smoke-test sizes, not figures to quote)" if report["quick"] else "")
           + ". Regenerate with `make bench`; docs/performance.md explains what each table measures.", "",
           "## Machine", "", _table(["", ""], [[k, v] for k, v in report["machine"]]), "", READING, ""]
    targets = _targets(report)
    if targets:
        out += ["## Targets", "", _table(["target", "goal", "measured", ""], targets), ""]
    for name, bench in report["benchmarks"].items():
        out += [f"## ({bench['label']}) {bench['title']}", ""]
        for run in bench["runs"]:
            out.append(f"`{run['command']}` ({run['seconds']:.0f} s)")
            out.append("")
            if "error" in run:
                out += ["**Failed:**", "", "```", run["error"], "```", ""]
                continue
            out += [note for note in run.get("notes", [])] + ([""] if run.get("notes") else [])
            for table in run["tables"]:
                out += [f"**{table['title']}**", "", _table(table["columns"], table["rows"]), ""]
                out += [f"- {note}" for note in table["notes"]] + ([""] if table["notes"] else [])
    return "\n".join(out).rstrip() + "\n"
