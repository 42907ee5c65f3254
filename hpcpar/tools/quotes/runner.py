"""Running the commands of the docs: in a scratch directory, each command once per session.

The commands are written for the repository root with the project's virtual environment
(``.venv/bin/hpcpar``, ``.venv/bin/mpiexec``).  The scratch directory gets a ``.venv`` link to the
environment that runs this code and a ``data`` link to the repository's shipped sample text
(``data/sample.txt``), so the files a page's commands write (``runs/``, ``ck/``, PNGs)
land there and never in the repository; commands of one page run in order and see each other's
files.  ``HPCPAR_MPIEXEC`` (set by the Makefile, e.g. for Open MPI's flags) replaces
``.venv/bin/mpiexec``.  The output is what the command wrote to stdout, and to stderr as well when
it failed (the error lines the docs quote); the progress bars on stderr are left out.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Session:
    """A scratch directory and the outputs of the commands run in it, by command."""

    def __init__(self, root=None, timeout=1800):
        self.root = Path(root or tempfile.mkdtemp(prefix="hpcpar-docs-"))
        self.timeout = timeout
        self.outputs = {}
        venv = self.root / ".venv"
        if not venv.exists():
            venv.symlink_to(Path(sys.prefix).resolve())
        data = self.root / "data"
        if not data.exists() and (REPOSITORY / "data").is_dir():
            data.symlink_to(REPOSITORY / "data")

    def _shell_text(self, command):
        launcher = os.environ.get("HPCPAR_MPIEXEC")
        if launcher and command.lstrip().startswith(".venv/bin/mpiexec "):
            command = command.replace(".venv/bin/mpiexec", launcher, 1)
        return command

    def output(self, command):
        """(exit status, output lines) of ``command``, run once."""
        if command not in self.outputs:
            env = dict(os.environ, **THREADS, PYTHONUNBUFFERED="1")
            try:
                proc = subprocess.run(["bash", "-c", self._shell_text(command)], cwd=self.root, env=env,
                                      capture_output=True, text=True, timeout=self.timeout)
                text = proc.stdout + (proc.stderr if proc.returncode else "")
                self.outputs[command] = (proc.returncode, text.splitlines())
            except subprocess.TimeoutExpired:
                self.outputs[command] = (124, [f"(timed out after {self.timeout} s)"])
        return self.outputs[command]

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)
