"""What a training run reports at each step, as it happens: DVCLive's metrics and plots, the run's
JSON-lines history (log.jsonl, in the run folder) and the stage's progress (progress.Progress).
The train stage creates one and passes it to `train()` as `log_step` (rank 0 only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from policypipe.progress import Progress


class TrainingLog:
    """`log_step(record)`: one record a step (`step`, `train_loss`; `val_loss` when validated and the
    `val_executed_*` errors at a ranked checkpoint)."""

    def __init__(self, total: int, live_dir: Path, jsonl: Path, stream: TextIO | None = None) -> None:
        self.total, self.live_dir, self.jsonl, self.stream = total, live_dir, jsonl, stream
        self.progress: Progress | None = None
        self.live = None

    def __call__(self, record: dict) -> None:
        from dvclive import Live

        if self.live is None:  # the first record says whether the run resumed, and from where
            resumed = record["step"] > 1
            # dvcyaml=None: metrics and plots are declared in dvc.yaml by hand, never rewritten.
            self.live = Live(
                str(self.live_dir), resume=resumed, save_dvc_exp=False, dvcyaml=None, report=None
            )
            self.progress = Progress(
                self.total, desc="train", unit="step", initial=record["step"] - 1, stream=self.stream
            )
            if not resumed:
                self.jsonl.unlink(missing_ok=True)
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        self.live.step = record["step"]
        for key, value in record.items():
            if key != "step":
                # val_loss -> val/loss, val_executed_score -> val/executed_score, lr -> train/lr
                self.live.log_metric(f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}", value)
        self.live.next_step()
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.progress.update(
            1,
            loss=f"{record['train_loss']:.4f}",
            **({"val": f"{record['val_loss']:.4f}"} if "val_loss" in record else {}),
        )

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.live is not None:
            self.live.end()
