"""What a Slurm job asks of the cluster: the `slurm` sub-sections of `convert` and `train`.

Plain frozen dataclasses with no imports beyond the standard library: `ConvertConfig` holds
one, and the conversion cache's key hashes the code `ConvertConfig` imports.

Cluster-specific values (partition, account, QOS) need not be committed: `slurm.local.yaml`
beside params.yaml, which git ignores, may set them (`with_local_values`), for every stage at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys the untracked file may set: where jobs run and who pays, never what they compute.
LOCAL_KEYS = ("partition", "account", "qos")
LOCAL_FILE = Path("slurm.local.yaml")


@dataclass(frozen=True)
class SlurmArrayConfig:
    """`convert.slurm`: one array task per batch of recordings."""

    partition: str | None = None  # null: the cluster's default partition
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int = 4  # conversion processes per task
    mem_gb: float = 8.0
    time_min: int = 60  # per task
    max_concurrent: int = 16  # array tasks running at once
    recordings_per_task: int = 8
    # A task that dies (killed, node failure) is run again this many times, its recordings one
    # per task, so a recording that kills its task takes no other with it.
    retries: int = 2

    def __post_init__(self) -> None:
        _check_positive(self, "cpus_per_task", "mem_gb", "time_min", "max_concurrent", "recordings_per_task")
        if self.retries < 0:
            raise ValueError(f"slurm.retries must be >= 0, got {self.retries}")


@dataclass(frozen=True)
class SlurmAllocationConfig:
    """`train.slurm`: one allocation; `train.num_processes` processes spread over `nodes`."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0  # 0: CPU processes (gloo); else one process per GPU
    cpus_per_task: int = 8  # per training process (data loading workers included)
    mem_gb: float = 64.0  # per node
    time_min: int = 240  # per segment: a requeued job gets a new time limit
    # Slurm sends SIGUSR1 this long before the time limit: training checkpoints at the next step
    # boundary and the job is requeued. Leave time for one step and a checkpoint.
    signal_before_end_s: int = 120
    # Requeues after which the stage gives up (a run that never progresses must end).
    max_requeues: int = 20

    def __post_init__(self) -> None:
        _check_positive(self, "nodes", "cpus_per_task", "mem_gb", "time_min", "signal_before_end_s")
        for name in ("gpus_per_node", "max_requeues"):
            if getattr(self, name) < 0:
                raise ValueError(f"slurm.{name} must be >= 0, got {getattr(self, name)}")


def _check_positive(config: Any, *names: str) -> None:
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"slurm.{name} must be > 0, got {getattr(config, name)}")


def with_local_values(config: Any, path: Path = LOCAL_FILE) -> Any:
    """`config` with the cluster-specific values of the untracked file, if there is one; a key
    the file may not set is refused (the rest belongs in params.yaml, where DVC tracks it)."""
    if not Path(path).is_file():
        return config
    import yaml

    values = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of {', '.join(LOCAL_KEYS)}")
    unknown = sorted(set(values) - set(LOCAL_KEYS))
    if unknown:
        raise ValueError(
            f"{path}: unknown key(s) {', '.join(unknown)}; it may set {', '.join(LOCAL_KEYS)} "
            "(the rest belongs in params.yaml, where DVC tracks it)"
        )
    for key, value in values.items():
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{path}: {key} must be a string, got {value!r}")
    return dataclasses.replace(config, **values)
