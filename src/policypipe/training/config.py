"""The `train` section of params.yaml, checked when built: a config that cannot work fails here,
before any work starts, naming the param to change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from policypipe.atomic import canonical_json
from policypipe.cluster.resources import SlurmAllocationConfig
from policypipe.config import ConfigError, from_mapping
from policypipe.dataset.windows import WindowConfig
from policypipe.policy.config import PolicyConfig, unet_horizon_multiple

# What the top-k checkpoints can be ranked by (training/ranking.py).
RANK_BY = ("executed_error", "val_loss")


@dataclass(frozen=True)
class PrivilegedExport:
    """`train.privileged`: the sample export whose ground truth the privileged control observes in
    place of the camera (`synthetic.privileged`; docs/rollout.md, "The privileged control"): the
    settings `policypipe sample` wrote data/raw with. A control experiment, never a real policy."""

    seed: int = 0
    recordings: int = 96
    recovery: float = 0.0
    hand: float = 0.0


@dataclass(frozen=True)
class TrainConfig:
    """`train` section of params.yaml (model sizes in `train.model`)."""

    seed: int = 0
    steps: int = 2000
    batch_size: int = 64  # per optimizer step, over all processes and accumulation
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 1e-6
    warmup_steps: int = 200
    grad_clip: float = 1.0
    # The EMA of the weights (what is evaluated and exported): `schedules.ema_decay`.
    ema_inv_gamma: float = 1.0
    ema_power: float = 0.75
    ema_min_decay: float = 0.0
    ema_max_decay: float = 0.9999
    # Intra-op threads of CPU work. On CPU the weights depend on it (a reduction split over more threads
    # adds in another order), so it is pinned, not left to the machine's core count.
    cpu_threads: int = 1
    mixed_precision: str = "no"  # "no" | "bf16"
    # How a step is computed, not what (docs/training.md, "Throughput"): training's crops laid out
    # channel last for the encoder, and AdamW's fused kernel. Each changes the order of sums and so
    # the weights' last bits: both are part of a run's identity. Both false: the earlier code path.
    channels_last: bool = True
    fused_adamw: bool = True
    num_workers: int = 2
    # Decoded training frames kept in memory, up to this many MB (dataset.frame_cache); 0: every
    # sample decodes its frames. The same bytes either way: only the time changes.
    frame_cache_mb: int = 1024
    val_every: int = 100
    val_batches: int = 4
    checkpoint_every: int = 200
    keep_top_k: int = 2
    # What the top-k are ranked by (training/ranking.py): "executed_error", the executed-step error
    # of the EMA weights on rank_samples fixed validation windows relative to holding still's, or
    # "val_loss". Both are recorded at every checkpoint; neither changes the weights.
    rank_by: str = "executed_error"
    # What the policy folder holds: the last step's EMA weights, or the best-ranked checkpoint's
    # (top_k's first by rank_by), named in the policy's manifest.
    export: Literal["last", "best"] = "last"
    rank_samples: int = 64
    num_processes: int = 1
    # local: this machine (num_processes > 1: relaunched with torch's launcher); slurm: the stage
    # submits itself as one job of num_processes processes over slurm.nodes nodes.
    launcher: Literal["local", "slurm"] = "local"
    slurm: SlurmAllocationConfig = field(default_factory=SlurmAllocationConfig)
    # Where checkpoints go when data/train cannot be written (disk full, quota); null: nowhere.
    # A resume considers its checkpoints too, and takes the newest of this setup.
    fallback_dir: str | None = None
    # Out of memory in the first steps: halve the per-device batch and double grad_accum (the
    # batch per optimizer step is kept), down to this many samples per device.
    min_device_batch: int = 2
    # Before the diffusion training, this many steps of the event loss alone on the image encoder
    # (every camera's with model.events_from_every_camera) and the event head (`training.pretrain`;
    # needs model.event_loss_weight > 0); and whether those encoders then stay as pretrained (their
    # weights no longer trained).
    encoder_pretrain_steps: int = 0
    freeze_encoder: bool = False
    # The exported policy's runner (`runtime.runner`, its spec): a step that asks the fingers to open by
    # less than this above their reading holds them at the reading (a gripper's deadband: a chunk's
    # small error in the width no longer lets a held block fall), unless the gripper reports that it
    # holds nothing (`runtime.observation.GripperState.holding`). 0: the policy's width as it is.
    open_deadband_mm: float = 0.0
    model: PolicyConfig = field(default_factory=PolicyConfig)
    # null: the policy sees through its cameras. A mapping: the privileged control (PrivilegedExport).
    privileged: PrivilegedExport | None = None

    def __post_init__(self) -> None:
        # Each value checked alone first, naming its range, so a bad one is reported as itself
        # (num_processes 0 would otherwise surface as a division by zero below).
        for name in (
            "steps",
            "batch_size",
            "grad_accum",
            "val_every",
            "val_batches",
            "checkpoint_every",
            "num_processes",
            "min_device_batch",
            "cpu_threads",
            "rank_samples",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        # keep_top_k 0: `latest` only; frame_cache_mb 0: no decoded frames kept.
        for name in (
            "warmup_steps",
            "keep_top_k",
            "num_workers",
            "frame_cache_mb",
            "encoder_pretrain_steps",
            "open_deadband_mm",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        # `not x > 0` is true for NaN too. A zero learning rate never moves the weights, and a zero
        # clip norm zeroes every gradient: the run would spend its budget learning nothing.
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        if not self.grad_clip > 0:
            raise ValueError(
                f"grad_clip must be > 0 (a gradient-norm limit; .inf: no clipping), got {self.grad_clip}"
            )
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.batch_size % (self.grad_accum * self.num_processes):
            raise ValueError(
                f"batch_size {self.batch_size} must be divisible by grad_accum x num_processes "
                f"({self.grad_accum} x {self.num_processes})"
            )
        if self.launcher == "slurm":
            per_node, rest = divmod(self.num_processes, self.slurm.nodes)
            if rest or per_node == 0:
                raise ValueError(
                    f"num_processes {self.num_processes} must be a multiple of "
                    f"slurm.nodes {self.slurm.nodes} "
                    "(the same number of processes on every node)"
                )
            if self.slurm.gpus_per_node not in (0, per_node):
                raise ValueError(
                    f"slurm.gpus_per_node {self.slurm.gpus_per_node} must be 0 (CPU processes) or the "
                    f"processes per node, num_processes / slurm.nodes = {per_node} (one process a GPU)"
                )
        if self.rank_by not in RANK_BY:
            raise ValueError(f"rank_by must be one of {RANK_BY}, got {self.rank_by!r}")
        if self.encoder_pretrain_steps and not self.model.event_labels:
            raise ValueError(
                "encoder_pretrain_steps pretrains the encoder on the recordings' grasps and releases: "
                "set model.event_loss_weight > 0 too"
            )
        if self.freeze_encoder and not self.encoder_pretrain_steps:
            raise ValueError(
                "freeze_encoder keeps the pretrained encoder: set encoder_pretrain_steps > 0, or it would "
                "keep a random one"
            )
        if self.export == "best" and self.keep_top_k < 1:
            raise ValueError("export 'best' needs keep_top_k >= 1: the best-ranked checkpoint is a kept one")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {self.mixed_precision!r}")
        for name in ("ema_inv_gamma", "ema_power"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)}")
        if not 0 <= self.ema_min_decay <= self.ema_max_decay < 1:
            raise ValueError(
                f"ema_min_decay and ema_max_decay must satisfy 0 <= ema_min_decay <= ema_max_decay < 1, "
                f"got {self.ema_min_decay} and {self.ema_max_decay}"
            )

    @property
    def window(self) -> WindowConfig:
        return WindowConfig(self.model.n_obs_steps, self.model.horizon, self.model.n_action_steps)

    def run_determining(self) -> dict[str, Any]:
        """What decides the weights a run ends with (not where or how fast it runs), flat and
        in JSON form: {"lr": ..., "model.down_dims": [...], ...}."""
        values = asdict(self)
        # grad_accum splits the same samples into smaller micro-batches (the out-of-memory
        # fallback changes it); a resumed run keeps the accumulation its checkpoint was made with.
        for key in (
            "num_workers",
            "frame_cache_mb",
            "fallback_dir",
            "val_every",
            "val_batches",
            "checkpoint_every",
            "keep_top_k",
            "rank_by",
            "rank_samples",
            "export",
            "grad_accum",
            "min_device_batch",
            "launcher",
            "slurm",
        ):
            values.pop(key)
        model = values.pop("model")
        values |= {f"model.{k}": v for k, v in model.items()}
        return json.loads(canonical_json(values))


def train_config_from_params(
    train: Mapping[str, Any] | None, policy: Mapping[str, Any] | None
) -> TrainConfig:
    """The `train` section with the shared `policy` section's window (what one sample spans) in
    its model: what the train stage and `policypipe smoke` run with.

    Where the two sections meet, their combination is checked before any work starts, in the
    sections' own terms: the horizon is set in `policy`, the U-Net's depth in `train.model`.
    """
    window = from_mapping(WindowConfig, policy, "policy")
    train = dict(train or {})
    given = train.get("model", {})
    model = (
        dict(given) if isinstance(given, Mapping) else {}
    )  # anything else: from_mapping says what it expects
    overridden = sorted(set(model) & {f.name for f in fields(WindowConfig)})
    if overridden:
        # It would be replaced by the `policy` section's value without a word.
        raise ConfigError(
            f"params.yaml [train.model]: {', '.join(f'train.model.{k}' for k in overridden)} is set in "
            "the shared [policy] section (stats and eval read it too): remove it from train.model"
        )
    if "scene_state_dim" in model:
        raise ConfigError(
            "params.yaml [train.model]: train.model.scene_state_dim is set by train.privileged (the "
            "privileged control's observation): remove it"
        )
    from_dataset = sorted(set(model) & {"grippers", "cameras", "joint_names"})
    if from_dataset:
        raise ConfigError(
            f"params.yaml [train.model]: {', '.join(f'train.model.{k}' for k in from_dataset)} is the "
            "dataset's (convert.grippers, convert.cameras, pair.aloha.joint_names), read from its "
            "statistics: remove it"
        )
    down_dims = model.get("down_dims", PolicyConfig.down_dims)
    if isinstance(down_dims, (list, tuple)) and window.horizon % unet_horizon_multiple(tuple(down_dims)):
        multiple = unet_horizon_multiple(tuple(down_dims))
        fits = sorted(
            {
                max(multiple, window.horizon // multiple * multiple),
                (window.horizon // multiple + 1) * multiple,
            }
        )
        raise ConfigError(
            f"params.yaml: policy.horizon {window.horizon} must be a multiple of {multiple} for the U-Net "
            f"(train.model.down_dims {list(down_dims)} has {len(down_dims)} levels; "
            "it halves the horizon at each "
            f"but the last): set policy.horizon to {' or '.join(map(str, fits))}, "
            "or use fewer train.model.down_dims"
        )
    if isinstance(given, Mapping):
        train["model"] = model | asdict(window)
    return from_mapping(TrainConfig, train, "train")


def model_for_dataset(model: PolicyConfig, stats: Mapping[str, Any]) -> PolicyConfig:
    """The model for the dataset the statistics describe: as many grippers and cameras as it keeps,
    or its joints (a dataset's, never a param)."""
    if "joints" in stats:
        names = tuple(stats["joints"]["names"])
        return replace(model, grippers=0, joint_names=names, cameras=len(stats["image"]))
    grippers = int(stats.get("grippers", {}).get("count", 1))
    return replace(model, grippers=grippers, cameras=len(stats["image"]))
