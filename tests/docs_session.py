"""The one scratch session in which the tests run the commands the docs quote (hpcpar/tools/quotes): a command
quoted in two places, or run by two tests, runs once per test session."""
import atexit
import functools

from hpcpar.tools.quotes.runner import Session


@functools.lru_cache(maxsize=None)
def docs_session():
    session = Session(timeout=300)     # a hard limit per command: a hang fails the test
    atexit.register(session.close)
    return session
