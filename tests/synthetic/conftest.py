"""The runtime tests' tiny real pipeline (sample recordings through convert and stats, a policy
saved with its runtime spec), for the privileged control's tests."""

from tests.runtime.test_runner import pipeline  # noqa: F401
