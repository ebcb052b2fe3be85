"""The `slurm` params and the untracked file of cluster-specific values."""

from __future__ import annotations

from pathlib import Path

import pytest

from policypipe.cluster.resources import SlurmAllocationConfig, SlurmArrayConfig, with_local_values
from policypipe.config import ConfigError
from policypipe.training.config import train_config_from_params


def test_the_untracked_file_sets_where_jobs_run_and_nothing_else(tmp_path: Path) -> None:
    local = tmp_path / "slurm.local.yaml"
    assert (
        with_local_values(SlurmArrayConfig(), local) == SlurmArrayConfig()
    )  # no file: the params as they are
    local.write_text("partition: gpu-a100\naccount: robots\n")
    config = with_local_values(SlurmArrayConfig(partition="debug", cpus_per_task=2), local)
    assert (config.partition, config.account, config.cpus_per_task) == ("gpu-a100", "robots", 2)

    local.write_text("partition: gpu\ncpus_per_task: 64\n")
    with pytest.raises(ValueError, match="unknown key.*cpus_per_task.*params.yaml"):
        with_local_values(SlurmArrayConfig(), local)


@pytest.mark.parametrize(
    ("slurm", "processes", "words"),
    [
        ({"nodes": 2}, 3, "num_processes 3 must be a multiple of slurm.nodes 2"),
        (
            {"nodes": 1, "gpus_per_node": 2},
            4,
            "slurm.gpus_per_node 2 must be 0 (CPU processes) or the processes per node",
        ),
        ({"time_min": 0}, 1, "slurm.time_min must be > 0"),
    ],
)
def test_a_slurm_launch_that_cannot_work_is_refused_before_any_work(
    slurm: dict, processes: int, words: str
) -> None:
    train = {"launcher": "slurm", "num_processes": processes, "batch_size": 12, "slurm": slurm}
    with pytest.raises(ConfigError) as info:
        train_config_from_params(train, {"n_obs_steps": 2, "horizon": 16, "n_action_steps": 8})
    assert words in str(info.value)


def test_where_training_runs_is_not_part_of_what_a_resume_compares() -> None:
    window = {"n_obs_steps": 2, "horizon": 16, "n_action_steps": 8}
    local = train_config_from_params({}, window)
    on_slurm = train_config_from_params(
        {"launcher": "slurm", "slurm": {"nodes": 1, "partition": "gpu"}}, window
    )
    assert on_slurm.slurm == SlurmAllocationConfig(partition="gpu")
    assert (
        local.run_determining() == on_slurm.run_determining()
    )  # a run started locally resumes on the cluster
