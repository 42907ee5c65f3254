"""What a check raises: the student's work is wrong (Wrong), or their code crashed on an MPI rank (Crashed)."""


class Wrong(Exception):
    """A check that failed; the message says what is wrong and what to look at."""


class Crashed(Exception):
    """The student's code raised on an MPI rank; the message names the rank and the line."""


def check_pair(answer, want, sizes, shape, what, more="many", fewer="few"):
    """A predicted pair of numbers (an ``ANSWER``) against the measured ``want``, at ``sizes`` (two labels,
    "ep 2"): each within 1 %, or Wrong naming the first that is not - never the answer.  ``shape`` says
    what the pair is, ``what`` what one number is, ``more``/``fewer`` how it is off."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and
            all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in answer)):
        raise Wrong(f"ANSWER is {shape}, got {answer!r}")
    for size, got, right in zip(sizes, answer, want):
        if abs(got - right) > 0.01 * right:
            raise Wrong(f"{what} at {size}, {got!r}, {'is' if more == 'large' else 'are'} too "
                        f"{more if got > right else fewer} (within 1 % passes)")
