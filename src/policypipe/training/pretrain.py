"""Pretraining the image encoder on the recordings' grasps and releases, before the policy trains.

`train.encoder_pretrain_steps` steps of the event loss alone (`DiffusionPolicy.compute_event_loss`:
camera 0's features, or every camera's with `events_from_every_camera`, -> the next grasp and release
poses, `dataset.events`) on those encoders and the event head, from the freshly initialised policy;
then the diffusion training starts from those weights (its EMA too), and with `train.freeze_encoder`
without changing those encoders again. The
issue's control for this (docs/rollout.md): an encoder pretrained on the simulator's ground truth
and frozen took closed-loop success from 4 % to 22 % at the same budget; the labels here come from
the recordings alone.

Pretraining has its own optimizer, sampler and noise, seeded from `train.seed`, so it is a pure
function of the run's identity: a run killed during it starts again from scratch (there is no
checkpoint before step 0), and one resumed later has the pretrained weights in its checkpoint.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from policypipe.dataset.window_dataset import WindowDataset
from policypipe.policy.diffusion import DiffusionPolicy
from policypipe.training.sampler import EpochSampler, MicroBatches

# Pretraining's sampler and noise are seeded apart from the training's (seed + this).
PRETRAIN_SEED_OFFSET = 7_919


def pretrain_encoder(
    policy: DiffusionPolicy,
    dataset: WindowDataset,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: torch.device,
) -> list[float]:
    """Trains `policy`'s event encoders (`event_encoders`) and event head on the event loss for
    `steps` steps in place; the loss of each step."""
    modules = [*policy.event_encoders(), policy.event_head]
    optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=lr)
    generator = torch.Generator().manual_seed(seed + PRETRAIN_SEED_OFFSET)
    sampler = EpochSampler(len(dataset), batch_size, seed + PRETRAIN_SEED_OFFSET)
    # In this process: the frames are decoded in memory by now (keep_decoded_frames), and the main
    # loop's workers start after this.
    loader = DataLoader(dataset, batch_sampler=MicroBatches(sampler, 0, 1, 1), num_workers=0)
    losses = []
    for _, batch in zip(range(steps), loader):
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = policy.compute_event_loss(batch, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for m in modules for p in m.parameters()], 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses
