"""What the top-k checkpoints are ranked by: the validation loss, or the executed-step error that
`eval` reports, measured on a fixed subset of the validation windows.

The denoising loss on held-out windows measures how well the network predicts noise at random
diffusion steps; `eval` reports the error of the actions a robot would execute, sampled with DDIM
from pure noise. The two need not agree (the loss may rise while the executed error still falls),
so a checkpoint can also be ranked by the executed error itself: the EMA weights predict the
chunks of `rank_samples` validation windows, evenly spaced over them and the same at every
checkpoint, with noise from a fixed seed, and each component's mean error over the executed
steps is divided by holding still's on the same windows (a scale the data fixes, so position in
millimetres, rotation in degrees and width in millimetres weigh alike); the score is the mean of
the three ratios (joint space: the two ratios of the arm joints' and the grippers' errors,
`errors.joint_errors`). docs/training.md ("Checkpoints and resume") has the measurement behind the
default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from policypipe.dataset.joint_windows import JointSeries
from policypipe.dataset.window_dataset import WindowDataset
from policypipe.evaluation.errors import executed_errors, hold_still, joint_errors, joint_hold_still
from policypipe.policy.diffusion import DiffusionPolicy


def executed_means(
    chunks: np.ndarray, recorded: np.ndarray, n_action_steps: int, gripper_dims: list[int] | None = None
) -> dict[str, float]:
    """Each component's error, averaged over the samples, the executed steps and the grippers (10
    numbers each); for joint-space chunks (`gripper_dims` given: which of the D are grippers), over
    the arm joints and over the grippers (`errors.joint_errors`)."""
    if gripper_dims is not None:
        errors = joint_errors(chunks, recorded, gripper_dims)
        return {c: float(e[:, :n_action_steps].mean()) for c, e in errors.items()}
    return {c: float(e.mean()) for c, e in executed_errors(chunks, recorded, n_action_steps).items()}


@dataclass(frozen=True)
class ExecutedErrorProbe:
    """A fixed subset of the validation windows and holding still's errors on it."""

    batch: dict[str, torch.Tensor]  # the windows' observations and recorded actions
    hold_still_error: dict[str, float]
    n_action_steps: int
    seed: int
    gripper_dims: list[int] | None = None  # joint space: which dimensions are grippers

    @classmethod
    def of(cls, windows: WindowDataset, samples: int, n_action_steps: int, seed: int) -> ExecutedErrorProbe:
        picks = np.unique(np.linspace(0, len(windows) - 1, min(samples, len(windows))).round().astype(int))
        items = [windows[int(i)] for i in picks]
        batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
        recorded = batch["action"].double().numpy()
        if isinstance(windows.streams, JointSeries):
            dims = windows.streams.gripper_dims
            still = joint_hold_still(batch["obs_state"].double().numpy(), recorded.shape[1])
            return cls(
                batch, executed_means(still, recorded, n_action_steps, dims), n_action_steps, seed, dims
            )
        grippers = recorded.shape[-1] // 10
        still = executed_means(
            np.tile(hold_still(len(picks), recorded.shape[1]), (1, 1, grippers)), recorded, n_action_steps
        )
        return cls(batch, still, n_action_steps, seed)

    @torch.no_grad()
    def measure(self, policy: DiffusionPolicy, device: torch.device) -> dict[str, float]:
        """{component: executed error, "score": mean of the ratios to holding still} of `policy`."""
        was_training = policy.training
        policy.eval()
        generator = torch.Generator().manual_seed(self.seed)  # its own: the run's RNG is not touched
        observation = {k: v.to(device) for k, v in self.batch.items() if k != "action"}
        chunks = policy.predict_action(observation, generator).double().cpu().numpy()
        policy.train(was_training)
        errors = executed_means(
            chunks, self.batch["action"].double().numpy(), self.n_action_steps, self.gripper_dims
        )
        ratios = [errors[c] / max(self.hold_still_error[c], 1e-12) for c in self.hold_still_error]
        return errors | {"score": float(np.mean(ratios))}
