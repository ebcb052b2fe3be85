"""The runtime tests' shared fixture: the tiny real pipeline of test_runner.py (sample recordings
through convert and stats, an untrained policy saved with its runtime spec), for every module here."""

from tests.runtime.test_runner import pipeline  # noqa: F401
