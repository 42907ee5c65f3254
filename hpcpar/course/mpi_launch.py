"""Starting an MPI exercise: ``mpiexec -n ranks`` of hpcpar/course/mpi_rank.py with a timeout, and its
verdict read back from the job's log (the line rank 0 prints after MARK)."""
import sys
import tempfile
from pathlib import Path

from hpcpar import launch as launcher
from hpcpar.course.wrong import Crashed, Wrong

MARK = "course-verdict:"


def launch(exercise, path, timeout):
    """Run ``exercise``'s check on ``exercise.ranks`` ranks; raise Wrong unless every rank passed."""
    cmd = launcher.mpiexec() + ["-n", str(exercise.ranks), sys.executable, "-m", "hpcpar.course.mpi_rank",
                                str(exercise.number), str(path) if path else "-"]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        status, _ = launcher.run_job(cmd, log, timeout)
        lines = log.read_text(errors="replace").splitlines()
    said = [line[len(MARK):].strip() for line in lines if line.startswith(MARK)]
    if status is None:
        raise Wrong(f"the {exercise.ranks} ranks did not finish in {timeout} s: a deadlock - some rank waits "
                    "in a call whose partner is never made (a blocking send both ways, a receive nobody "
                    "sends, a collective one rank skips)" + (f"; before that: {said[0]}" if said else ""))
    if said and said[0] == "passed":
        return
    if said and said[0].startswith("not-written"):
        raise NotImplementedError
    if said and said[0].startswith("crashed "):
        raise Crashed(said[0][len("crashed "):])
    if said:
        raise Wrong(said[0])
    raise Wrong(f"the job ended with status {status} without a verdict: {lines[-1] if lines else '(no output)'}")
