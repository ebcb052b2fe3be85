"""The rollout tests' shared fixtures: the runtime tests' tiny pipeline and its monitored policy."""

from tests.monitor.conftest import monitored, pipeline  # noqa: F401 (fixtures, by name)
