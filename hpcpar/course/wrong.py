"""What a check raises: the student's work is wrong (Wrong), or their code crashed on an MPI rank (Crashed)."""


class Wrong(Exception):
    """A check that failed; the message says what is wrong and what to look at."""


class Crashed(Exception):
    """The student's code raised on an MPI rank; the message names the rank and the line."""
