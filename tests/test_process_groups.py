"""`make test`'s test processes: the tests that share a costly fixture run in one process, which
builds it once (tests/conftest.py, `process_group`; `--dist loadgroup`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def module_fixture() -> str:
    """Stands for a sampled checkout or a Slurm setup: a module-scoped fixture."""
    return "built"


@pytest.mark.parametrize("test", ["one", "another"])
def test_a_module_fixtures_tests_report_the_group_that_the_scheduler_keeps_together(
    request: pytest.FixtureRequest, module_fixture: str, test: str
) -> None:
    # The scheduler sees only the ids the test processes report: without the group's suffix (as
    # with pytest-xdist 3.8 on pytest 9.2, which lost it unnoticed) the tests are spread.
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs in a test process of --dist loadgroup (make test, make test-fast)")
    assert request.node.nodeid.endswith(f"[{test}]@tests/test_process_groups.py")
