"""The runtime tests' shared fixtures: the tiny real pipeline of test_runner.py (sample recordings
through convert and stats, an untrained policy saved with its runtime spec), for every module here,
and its policy with the monitor calibrated (tests/monitor/conftest.py)."""

from tests.monitor.conftest import monitored  # noqa: F401
from tests.runtime.test_runner import pipeline  # noqa: F401
