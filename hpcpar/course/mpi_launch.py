"""Starting an MPI exercise: ``mpiexec -n ranks`` of hpcpar/course/mpi_rank.py with a timeout, and its
verdicts read back from the job's log (the lines rank 0 prints after MARK, one per file checked).

One job may check several files of one exercise in turn (``verdicts``: the tests grade a list of wrong
answers in one launch); a file whose code crashes or hangs ends the job, and the files after it get
no verdict."""
import sys
import tempfile
from pathlib import Path

from hpcpar import launch as launcher
from hpcpar.course.wrong import Crashed, Wrong

MARK = "course-verdict"


def verdicts(exercise, paths, timeout):
    """Run ``exercise``'s check on ``exercise.ranks`` ranks for each file of ``paths``; returns one
    exception per file (None: passed), in order."""
    cmd = launcher.mpiexec() + ["-n", str(exercise.ranks), sys.executable, "-m", "hpcpar.course.mpi_rank",
                                str(exercise.number)] + [str(p) for p in paths]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        status, _ = launcher.run_job(cmd, log, timeout)
        lines = log.read_text(errors="replace").splitlines()
    said = {}
    for line in lines:
        if line.startswith(MARK + " "):
            index, _, text = line[len(MARK) + 1:].partition(": ")
            said.setdefault(int(index), text.strip())
    out = []
    for i in range(len(paths)):
        text = said.get(i)
        if text == "passed":
            out.append(None)
        elif text is not None:
            out.append(NotImplementedError() if text.startswith("not-written") else
                       Crashed(text[len("crashed "):]) if text.startswith("crashed ") else Wrong(text))
        elif status is None:
            out.append(Wrong(f"the {exercise.ranks} ranks did not finish in {timeout:g} s: a deadlock - some rank "
                             "waits in a call whose partner is never made (a blocking send both ways, a receive "
                             "nobody sends, a collective one rank skips)"))
        else:
            out.append(Wrong(f"the job ended with status {status} without a verdict: "
                             f"{lines[-1] if lines else '(no output)'}"))
    return out


def launch(exercise, paths, timeout):
    """Raise the verdict of the first file of ``paths`` (Wrong, Crashed, NotImplementedError), if any."""
    err = verdicts(exercise, paths[:1], timeout)[0]
    if err is not None:
        raise err
