"""Run the benchmark suite: each benchmark side by side with its baseline, in one run, written as JSON
and as the Markdown tables of BENCHMARKS.md (docs/performance.md explains every table).

  hpcpar bench                                   every benchmark (2-6 minutes on 2 cores, with other jobs)
  hpcpar bench --only p2p,collectives            some of them
  hpcpar bench --quick --only gemm               tiny sizes: checks that it runs, not figures to quote
  hpcpar bench --out bench/results.json --markdown BENCHMARKS.md      (what `make bench` runs)

Benchmarks that need ranks are started as `mpiexec -n N` jobs ($HPCPAR_MPIEXEC, else the mpiexec
next to this Python).  PyTorch rows need torch (pip install torch==2.13.0) and are skipped without
it; the GPU section needs cupy and a device.  Run it from a shell, not under mpiexec.
"""
HELP = "benchmarks against raw MPI, the BLAS peak and PyTorch -> JSON and BENCHMARKS.md"


def add_arguments(p):
    from hpcpar.tools.bench import BENCHMARKS
    names = ", ".join(f"{n} ({s.label})" for n, s in BENCHMARKS.items())
    p.add_argument("--only", metavar="NAMES", help=f"comma-separated benchmarks to run, of: {names}")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few rounds (a smoke test)")
    p.add_argument("--out", metavar="JSON", help="write every figure to this JSON file")
    p.add_argument("--markdown", metavar="MD", help="write the tables to this Markdown file (BENCHMARKS.md)")


def run(args):
    import sys

    from hpcpar.tools.bench import BENCHMARKS
    from hpcpar.tools.bench import driver
    from hpcpar.runtime import EXIT_FAILURE, UsageError, launched_by_mpi
    if launched_by_mpi():
        raise UsageError("hpcpar bench starts its own MPI jobs: run it from a shell, not under mpiexec")
    names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown or not names:
        raise UsageError(f"--only: unknown benchmark {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(BENCHMARKS)}")
    command = " ".join(["hpcpar"] + sys.argv[1:])
    report = driver.run(names, args.quick, args.out, args.markdown, command)
    failed = driver.failures(report)
    print(f"hpcpar bench: {len(names)} benchmark(s) in {report['seconds']:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + "".join(f"; wrote {p}" for p in (args.out, args.markdown) if p))
    return EXIT_FAILURE if failed else 0
