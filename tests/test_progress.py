"""Progress off a terminal (CI, a log file, a Slurm job's log): plain lines, a few seconds apart,
with the count, the rate, the stage's figures and the time left; on a terminal, tqdm's bar."""

from __future__ import annotations

import io
import json
import re

from policypipe.live_metrics import TrainingLog
from policypipe.progress import Progress, duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


LINE = re.compile(
    r"^train: (\d+)/3000 step \(\d+%\), ([\d.]+) step/s, loss=[\d.]+(, val=[\d.]+)?, (\S+) left$"
)


def test_off_a_terminal_progress_is_one_plain_line_every_few_seconds_with_rate_loss_and_time_left() -> None:
    stream, clock = io.StringIO(), FakeClock()
    progress = Progress(3000, desc="train", unit="step", stream=stream, every_s=10, clock=clock)
    for step in range(1, 401):  # 400 steps at 8 steps/s: 50 s, so five lines
        clock.now += 0.125
        figures = {"loss": f"{1 / step:.4f}"} | ({"val": "0.2500"} if step == 50 else {})
        progress.update(1, **figures)
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 5, text
    for line in lines:
        match = LINE.match(line)
        assert match, line
        done, rate = int(match.group(1)), float(match.group(2))
        assert done % 80 == 0 and rate == 8  # every 10 s of the fake clock: 80 steps
        assert match.group(4) == duration((3000 - done) / 8)
        assert match.group(3) == ", val=0.2500"  # the last validation loss stays until the next
    assert lines[0] == "train: 80/3000 step (3%), 8 step/s, loss=0.0125, val=0.2500, 6m05s left"
    clock.now += 0.125
    progress.update(1, loss="0.0020")
    progress.close()  # updates since the last line: one more, the last count
    assert stream.getvalue().splitlines()[-1].startswith("train: 401/3000 step")


def test_the_last_step_is_reported_at_once_and_close_adds_nothing_after_it() -> None:
    stream, clock = io.StringIO(), FakeClock()
    with Progress(4, desc="convert", unit="rec", stream=stream, clock=clock) as progress:
        for _ in range(4):
            clock.now += 1
            progress.update(1, frames_per_s="120")
    assert stream.getvalue() == "convert: 4/4 rec (100%), 1 rec/s, frames_per_s=120, done in 4s\n"


def test_a_resumed_run_counts_its_rate_from_where_it_resumed() -> None:
    stream, clock = io.StringIO(), FakeClock()
    progress = Progress(100, desc="train", unit="step", initial=50, stream=stream, every_s=5, clock=clock)
    for _ in range(10):
        clock.now += 1
        progress.update(1)
    assert stream.getvalue().splitlines()[0] == "train: 55/100 step (55%), 1 step/s, 45s left"


def test_on_a_terminal_progress_is_tqdms_bar() -> None:
    stream = Terminal()
    with Progress(10, desc="train", unit="step", stream=stream) as progress:
        for _ in range(10):
            progress.update(1, loss="0.5000")
    assert "\r" in stream.getvalue() and "loss=0.5000" in stream.getvalue()


def test_the_training_log_writes_dvclive_the_history_and_plain_progress(tmp_path) -> None:
    stream = io.StringIO()
    log = TrainingLog(3, tmp_path / "live", tmp_path / "run" / "log.jsonl", stream=stream)
    records = [
        {"step": 1, "lr": 1e-3, "train_loss": 0.5},
        {"step": 2, "lr": 1e-3, "train_loss": 0.4, "val_loss": 0.45},
        {"step": 3, "lr": 1e-3, "train_loss": 0.3},
    ]
    for record in records:
        log(record)
    log.close()
    history = [json.loads(line) for line in (tmp_path / "run/log.jsonl").read_text().splitlines()]
    assert history == records
    assert (tmp_path / "live/metrics.json").is_file()
    assert stream.getvalue().startswith("train: 3/3 step (100%)") and "loss=0.3000, val=0.4500" in (
        stream.getvalue()
    )
    assert "\r" not in stream.getvalue()


def test_durations_read_as_minutes_and_hours() -> None:
    assert [duration(s) for s in (42, 125, 3720)] == ["42s", "2m05s", "1h02m"]
