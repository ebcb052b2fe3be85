"""The training loop on a tiny real store: exact resume after SIGKILL (one process and two),
refused resume, checkpoint faults, top-k by either ranking, out of memory on one rank of two,
the EMA schedule, weights independent of the process's thread count and of data workers."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import zarr
from safetensors.torch import load_file

from policypipe.training.checkpoint import CheckpointError, best_ranked_ema, load_checkpoint
from policypipe.training.config import TrainConfig
from policypipe.training.loop import train
from policypipe.training.schedules import ema_decay
from tests.training.conftest import CONFIG, MODEL


def run_training(
    dataset,
    run_dir: Path,
    config: TrainConfig = CONFIG,
    stats_sha: str = "s" * 64,
    stop_after=None,
    **changes,
):
    store, stats_path = dataset
    stats = json.loads(stats_path.read_text())
    stats.update(changes.pop("stats_changes", {}))
    return train(
        store=store,
        stats=stats,
        stats_sha256=stats_sha,
        config=replace(config, **changes),
        run_dir=run_dir,
        stop_after=stop_after,
    )


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / "latest" / "model.safetensors")


@pytest.mark.parametrize("rank_by", ["executed_error", "val_loss"])
def test_run_writes_latest_and_top_k_by_its_ranking_and_learns(dataset, tmp_path: Path, rank_by) -> None:
    result = run_training(dataset, tmp_path / "run", rank_by=rank_by)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert "latest" in names and len(names) == 1 + CONFIG.keep_top_k
    assert all(n.startswith(f"{rank_by}-") for n in names if n != "latest")
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["rank_by"] == rank_by
    # Both measured at every checkpoint (steps 4, 8, 12), whichever ranks.
    assert [s for s, _ in history["executed"]] == [4, 8, 12]
    assert {s for s, _ in history["val"]} >= {4, 8, 12}
    values = (
        [v for s, v in history["val"] if s % 4 == 0]
        if rank_by == "val_loss"
        else [e["score"] for _, e in history["executed"]]
    )
    best = sorted(values)[: CONFIG.keep_top_k]
    assert sorted(float(n.split("-")[1]) for n in names if n != "latest") == pytest.approx(best, abs=1e-5)
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "latest")
    assert state.trainer["step"] == 12 and state.trainer["complete"]
    assert result.best_val_loss <= result.first_val_loss
    assert result.best_executed["score"] == min(e["score"] for _, e in history["executed"])
    # train.export: best exports the first-ranked checkpoint's EMA weights and names it.
    ema, exported = best_ranked_ema(tmp_path / "run")
    ranked = [n for n in names if n != "latest"]
    (first,) = [n for n in ranked if float(n.split("-")[1]) == pytest.approx(best[0], abs=1e-5)]
    assert exported == {
        "export": "best",
        "export_step": int(first.split("-")[-1]),
        "rank_by": rank_by,
        "rank_value": pytest.approx(best[0], abs=1e-5),
    }
    kept = load_file(tmp_path / "run" / "checkpoints" / first / "ema.safetensors")
    assert ema.keys() == kept.keys() and all(torch.equal(ema[k], kept[k]) for k in kept)


def test_exporting_the_best_of_a_run_with_nothing_ranked_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "history.json").write_text(json.dumps({"val": [], "executed": [], "top_k": []}))
    with pytest.raises(CheckpointError, match=r"no checkpoint was ranked.*train.export: last"):
        best_ranked_ema(tmp_path)


def test_the_ranking_does_not_change_the_weights(dataset, tmp_path: Path) -> None:
    """Measuring the executed error draws its own noise: the run's RNG, and so its weights, are those
    of a run ranked by validation loss."""
    run_training(dataset, tmp_path / "executed", rank_by="executed_error")
    run_training(dataset, tmp_path / "loss", rank_by="val_loss")
    a, b = weights(tmp_path / "executed"), weights(tmp_path / "loss")
    assert all(torch.equal(a[k], b[k]) for k in a)


KILL_SCRIPT = """
import sys, json
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from tests.training.conftest import CONFIG
from policypipe.training.loop import train
stats = json.loads(Path(sys.argv[2]).read_text())
train(store=Path(sys.argv[1]), stats=stats, stats_sha256="s" * 64, config=CONFIG, run_dir=Path(sys.argv[4]))
"""


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_bitwise_identical_weights(dataset, tmp_path: Path) -> None:
    run_training(dataset, tmp_path / "straight")

    killed = tmp_path / "killed"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(dataset[0]), str(dataset[1]), str(repo), str(killed)]
    )
    latest = killed / "checkpoints" / "latest" / "trainer.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if latest.is_file() and json.loads(latest.read_text())["step"] >= 4:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    step_at_kill = json.loads(latest.read_text())["step"]
    assert 4 <= step_at_kill < 12, "the run was not interrupted part-way"

    result = run_training(dataset, killed)

    assert result.resumed_from == step_at_kill
    a, b = weights(tmp_path / "straight"), weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ema_a = load_file(tmp_path / "straight" / "checkpoints" / "latest" / "ema.safetensors")
    ema_b = load_file(killed / "checkpoints" / "latest" / "ema.safetensors")
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lr": 5e-4}, "train.lr: 0.001 -> 0.0005"),
        (
            {"stats_changes": {"dataset_fingerprint": {"sha256": "0" * 64}}},
            "the dataset (fingerprint) changed",
        ),
        ({"stats_sha": "t" * 64}, "the normalization statistics changed"),
    ],
)
def test_resume_is_refused_when_the_run_would_differ(
    dataset, tmp_path: Path, change: dict, named: str
) -> None:
    run_dir = tmp_path / "run"
    run_training(dataset, run_dir)
    state_file = run_dir / "checkpoints" / "latest" / "trainer.json"
    _mark_unfinished(run_dir)  # as a kill part-way would leave it
    with pytest.raises(CheckpointError) as info:
        if "stats_sha" in change:
            run_training(dataset, run_dir, stats_sha=change["stats_sha"])
        else:
            run_training(dataset, run_dir, **change)
    message = str(info.value)
    assert named in message and "start fresh" in message and str(run_dir) in message
    assert state_file.is_file()  # nothing was thrown away


def test_a_run_recorded_before_the_code_path_keys_resumes_on_the_earlier_path_only(
    dataset, tmp_path: Path
) -> None:
    # A checkpoint of the code before train.channels_last and train.fused_adamw records neither:
    # it was computed with both off, so it resumes so, and the new defaults are refused by name.
    from policypipe.training.checkpoint import TrainingState, save_checkpoint

    earlier = {"channels_last": False, "fused_adamw": False}
    run_dir = tmp_path / "run"
    run_training(dataset, run_dir, stop_after=4, **earlier)
    latest = run_dir / "checkpoints" / "latest"
    state = load_checkpoint(latest)
    # The event loss, the stem's max-pool, the event head's cameras, its labels' weighting and the
    # diffusion head's memory came later still.
    for key in [
        *earlier,
        "model.event_loss_weight",
        "model.encoder_stem_pool",
        "model.events_from_every_camera",
        "model.event_loss_near_m",
        "model.remember_release",
    ]:
        del state.trainer["config"][key]
    save_checkpoint(
        latest, TrainingState(state.model, state.ema, state.optimizer, state.trainer, state.rng_tensors)
    )
    with pytest.raises(
        CheckpointError, match=r"train.channels_last: False -> True.*fused_adamw: False -> True"
    ):
        run_training(dataset, run_dir)
    assert run_training(dataset, run_dir, **earlier).resumed_from == 4


def _mark_unfinished(run_dir: Path) -> None:
    """Turns a finished `latest` into an unfinished one, with a valid manifest."""
    from policypipe.training.checkpoint import TrainingState, save_checkpoint

    latest = run_dir / "checkpoints" / "latest"
    state = load_checkpoint(latest)
    state.trainer["complete"] = False
    save_checkpoint(
        latest, TrainingState(state.model, state.ema, state.optimizer, state.trainer, state.rng_tensors)
    )


def test_a_finished_run_with_another_config_starts_fresh(dataset, tmp_path: Path) -> None:
    run_training(dataset, tmp_path / "run")
    result = run_training(dataset, tmp_path / "run", lr=5e-4)
    assert result.resumed_from is None
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "latest").trainer["config"]["lr"] == 5e-4


def test_a_checkpoint_that_cannot_be_written_does_not_stop_training(
    dataset, tmp_path: Path, monkeypatch
) -> None:
    import policypipe.training.checkpoint as checkpoint

    real_save = checkpoint.save_checkpoint
    calls = {"n": 0}

    def failing_save(folder, state):
        calls["n"] += 1
        if calls["n"] > 2 and "fallback" not in str(folder):  # the disk fills up after the first save
            raise OSError(28, "No space left on device")
        return real_save(folder, state)

    monkeypatch.setattr(checkpoint, "save_checkpoint", failing_save)
    result = run_training(dataset, tmp_path / "run", fallback_dir=str(tmp_path / "fallback"))

    assert result.steps == CONFIG.steps  # training went on
    assert result.checkpoint_warnings and "No space left on device" in result.checkpoint_warnings[0]
    assert "written to the fallback" in result.checkpoint_warnings[0]
    assert (
        load_checkpoint(tmp_path / "run" / "checkpoints" / "latest").trainer["step"] == 4
    )  # the previous good one
    assert load_checkpoint(tmp_path / "fallback" / "latest").trainer["step"] == 12


@pytest.mark.parametrize(
    "run_folder_until", [4, 0], ids=["older-latest-in-run-folder", "nothing-in-run-folder"]
)
def test_resume_takes_the_newest_checkpoint_also_from_the_fallback_dir(
    dataset, tmp_path: Path, monkeypatch, run_folder_until: int
) -> None:
    import policypipe.training.checkpoint as checkpoint

    run_training(dataset, tmp_path / "straight")
    real_save = checkpoint.save_checkpoint

    def disk_full(folder, state):  # the run folder's disk fills up after step `run_folder_until`
        if "fallback" not in str(folder) and state.trainer["step"] > run_folder_until:
            raise OSError(28, "No space left on device")
        return real_save(folder, state)

    fallback = tmp_path / "fallback"
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save_checkpoint", disk_full)
        run_training(dataset, tmp_path / "run", fallback_dir=str(fallback), stop_after=8)  # then killed
    assert load_checkpoint(fallback / "latest").trainer["step"] == 8
    assert (tmp_path / "run" / "checkpoints" / "latest").exists() == (run_folder_until > 0)

    result = run_training(dataset, tmp_path / "run", fallback_dir=str(fallback))  # the disk has room again

    assert result.resumed_from == 8  # not 4, and not a fresh start
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_fallback_checkpoint_of_another_setup_is_not_resumed(dataset, tmp_path: Path) -> None:
    run_training(dataset, tmp_path / "other", lr=5e-4, stop_after=4)
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    (tmp_path / "other" / "checkpoints" / "latest").rename(fallback / "latest")
    result = run_training(dataset, tmp_path / "run", fallback_dir=str(fallback))
    assert result.resumed_from is None and result.steps == CONFIG.steps
    assert load_checkpoint(fallback / "latest").trainer["config"]["lr"] == 5e-4  # left alone


@pytest.mark.parametrize("stop_after", [8, None], ids=["unfinished", "finished"])
def test_with_latest_missing_the_top_k_checkpoints_are_kept(dataset, tmp_path: Path, stop_after) -> None:
    run_dir = tmp_path / "run"
    run_training(dataset, run_dir, stop_after=stop_after)
    checkpoints = run_dir / "checkpoints"
    shutil.rmtree(checkpoints / "latest")
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    top_k = sorted(p.name for p in checkpoints.iterdir())
    assert len(top_k) == CONFIG.keep_top_k

    with pytest.raises(CheckpointError) as info:
        run_training(dataset, run_dir)

    message = str(info.value)
    assert (
        "no `latest`" in message
        and "nothing was deleted" in message
        and all(name in message for name in top_k)
    )
    assert str(run_dir) in message  # what to move aside or delete to start fresh
    assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_damaged_checkpoint_is_refused_not_loaded(dataset, tmp_path: Path) -> None:
    run_training(dataset, tmp_path / "run")
    _mark_unfinished(tmp_path / "run")
    model = tmp_path / "run" / "checkpoints" / "latest" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-5] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors: SHA-256 differs"):
        run_training(dataset, tmp_path / "run")


def test_verify_command_checks_a_checkpoint_against_its_manifest(dataset, tmp_path: Path) -> None:
    run_training(dataset, tmp_path / "run")
    cli = Path(sys.executable).with_name("policypipe")
    latest = tmp_path / "run" / "checkpoints" / "latest"
    ok = subprocess.run([str(cli), "verify", str(latest)], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("OK")
    (latest / "trainer.json").write_text(
        (latest / "trainer.json").read_text().replace('"step": 12', '"step": 13')
    )
    bad = subprocess.run([str(cli), "verify", str(latest)], capture_output=True, text=True)
    assert bad.returncode == 1 and "trainer.json: SHA-256 differs" in bad.stdout


def test_out_of_memory_in_the_first_steps_halves_the_device_batch_and_keeps_the_step_batch(
    dataset, tmp_path: Path, monkeypatch
) -> None:
    from policypipe.policy.diffusion import DiffusionPolicy

    real_forward = DiffusionPolicy.forward
    seen: list[int] = []

    def small_memory(self, batch, generator=None):
        seen.append(len(batch["action"]))
        if len(batch["action"]) > 2:  # pretend the device holds two samples at most
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return real_forward(self, batch, generator)

    monkeypatch.setattr(DiffusionPolicy, "forward", small_memory)
    result = run_training(dataset, tmp_path / "run", min_device_batch=2)

    assert result.steps == CONFIG.steps
    assert len(result.oom_adjustments) == 2  # 8 -> 4 -> 2 samples per device
    assert "retrying with 2 and grad_accum 4" in result.oom_adjustments[-1]
    assert set(seen[-8:]) == {2}
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "latest").trainer["grad_accum"] == 4


def test_out_of_memory_below_the_floor_is_raised(dataset, tmp_path: Path, monkeypatch) -> None:
    from policypipe.policy.diffusion import DiffusionPolicy

    def no_memory(self, batch, generator=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(DiffusionPolicy, "forward", no_memory)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        run_training(dataset, tmp_path / "run", min_device_batch=4)


TWO_PROCESS_SCRIPT = """
import json, os, sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import policypipe.training.checkpoint as checkpoint
import policypipe.training.loop as loop
from tests.training.conftest import CONFIG

real_save = checkpoint.save_checkpoint
def recording_save(folder, state):  # who writes checkpoints, next to the run folder
    with open(Path(folder).parents[2] / "writers.txt", "a") as f:
        f.write(os.environ["RANK"] + "\\n")
    return real_save(folder, state)
checkpoint.save_checkpoint = recording_save

stats = json.loads(Path(sys.argv[2]).read_text())
config = replace(CONFIG, num_processes=2, steps=6, checkpoint_every=3, val_every=3)
for run_dir, stop_after, rank_1_stops_at in json.loads(sys.argv[4]):
    options = {}
    if rank_1_stops_at is not None:
        # A stop signal that reaches rank 1 before rank 0 (signals arrive at each process at its own
        # time): rank 1 asks from its `rank_1_stops_at`-th step boundary on, rank 0 never does.
        boundaries = []
        def stop_requested(boundaries=boundaries, at=rank_1_stops_at):
            boundaries.append(1)
            return os.environ["RANK"] == "1" and len(boundaries) >= at
        options["stop_requested"] = stop_requested
    result = loop.train(store=Path(sys.argv[1]), stats=stats, stats_sha256="s" * 64, config=config,
                        run_dir=Path(run_dir), stop_after=stop_after, **options)
    # One write of the whole line (under PIPE_BUF, so atomic on the shared pipe): print() writes
    # each argument apart when stdout is unbuffered, and the two ranks' words interleaved.
    line = " ".join(str(v) for v in ("rank", os.environ["RANK"], "resumed_from", result.resumed_from,
        "steps", result.steps, "loss", result.last_train_loss, "backed off", result.oom_adjustments,
        "run", Path(run_dir).name))
    os.write(1, (line + "\\n").encode())
"""

# Rank 1 alone cannot hold more than 2 samples (a smaller GPU, or a neighbour's memory): a test
# double of the forward pass, installed on that process only.
RANK_1_SHORT_OF_MEMORY = """
import os
import torch
import zarr
from policypipe.policy.diffusion import DiffusionPolicy

real_forward = DiffusionPolicy.forward
def small_memory(self, batch, generator=None):
    if len(batch["action"]) > 2:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    return real_forward(self, batch, generator)
if os.environ["RANK"] == "1":
    DiffusionPolicy.forward = small_memory
"""


def run_two_processes(
    dataset,
    runs: list[tuple[Path, int | None, int | None]],
    script: str = TWO_PROCESS_SCRIPT,
    timeout: float = 240,
) -> subprocess.CompletedProcess:
    """Runs `train` on 2 CPU processes (gloo), once per (run folder, stop_after, the step boundary
    from which rank 1 alone requests a stop, or None), one after the other in one launch: a launch
    costs seconds (two processes importing torch, the process group), a run of 6 steps far less."""
    repo = Path(__file__).resolve().parents[2]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "--no-python",
        sys.executable,
        "-c",
        script,
        str(dataset[0]),
        str(dataset[1]),
        str(repo),
        json.dumps([[str(d), s, r] for d, s, r in runs]),
    ]
    # A session of its own: on a timeout the workers are killed with the launcher, not left hanging.
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        raise subprocess.TimeoutExpired(command, timeout, stdout) from None
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def lines_of(done: subprocess.CompletedProcess, run: str) -> list[str]:
    """The lines the ranks printed at the end of `run`."""
    return [
        line for line in done.stdout.splitlines() if line.startswith("rank") and line.endswith(f"run {run}")
    ]


@pytest.fixture(scope="module")
def two_process_runs(dataset, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, ...]:
    """Two launches of two processes, shared by the tests below. The first trains `straight`,
    stops `resumed` at step 3, and `stopped` where rank 1 alone asks to stop; the second launch
    (fresh processes) resumes both."""
    root = tmp_path_factory.mktemp("two-processes")
    first = run_two_processes(
        dataset, [(root / "straight", None, None), (root / "resumed", 3, None), (root / "stopped", None, 2)]
    )
    second = run_two_processes(dataset, [(root / "resumed", None, None), (root / "stopped", None, None)])
    return root, first, second


@pytest.mark.slow
def test_two_processes_train_together_and_interrupted_and_resumed_end_with_the_uninterrupted_weights(
    two_process_runs,
) -> None:
    # The first launch ends with `resumed` stopped at step 3; the second launch (fresh processes)
    # resumes it. Each rank must continue with its own noise and crops, not rank 0's.
    root, first, second = two_process_runs
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    straight = sorted(line.split() for line in lines_of(first, "straight") if "steps 6" in line)
    assert [words[1] for words in straight] == ["0", "1"]
    assert straight[0][7] == straight[1][7]  # the same (gathered) loss on both ranks
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert sum("resumed_from 3 steps 6" in line for line in lines_of(second, "resumed")) == 2
    assert set((root / "writers.txt").read_text().split()) == {"0"}  # only rank 0 writes checkpoints

    for name in ("model.safetensors", "ema.safetensors"):
        a = load_file(root / "straight" / "checkpoints" / "latest" / name)
        b = load_file(root / "resumed" / "checkpoints" / "latest" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.0),
        (1, 0.0),  # the first two updates copy the weights, as in the reference
        (2, 1 - 2**-0.75),
        (100, 1 - 100**-0.75),  # 0.968
        (1500, 1 - 1500**-0.75),  # 0.9958 at the end of the demo: no warm-up cap of 0.994 in its place
        (10**6, 0.9999),  # clamped to ema_max_decay
    ],
)
def test_ema_decay_follows_the_reference_power_schedule(step: int, expected: float) -> None:
    assert ema_decay(step, TrainConfig()) == pytest.approx(expected, rel=1e-12, abs=0)


def test_ema_decay_is_clamped_to_the_configured_bounds() -> None:
    config = TrainConfig(ema_min_decay=0.5, ema_max_decay=0.9, ema_power=1.0, ema_inv_gamma=2.0)
    assert ema_decay(0, config) == 0.0  # the first updates copy, whatever the floor
    assert ema_decay(2, config) == 0.5  # 1 - (1 + 1/2) ** -1 = 0.33, raised to the floor
    assert ema_decay(11, config) == pytest.approx(1 - 1 / 6)  # s = 10: 1 - (1 + 5) ** -1
    assert ema_decay(100, config) == 0.9


def test_weights_do_not_depend_on_the_process_thread_count_the_data_workers_or_the_frame_cache(
    dataset, tmp_path: Path
) -> None:
    # A rerun of the demo differed because intra-op threads follow the machine unless pinned: a sum
    # split over 2 threads adds in another order than over 1. DataLoader workers only read samples,
    # and the decoded-frame cache (here in shared memory, for the workers) holds the decoder's bytes.
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        run_training(dataset, tmp_path / "a", steps=4, num_workers=0, frame_cache_mb=0)
        torch.set_num_threads(1)
        run_training(dataset, tmp_path / "b", steps=4, num_workers=2, frame_cache_mb=1)
        assert torch.get_num_threads() == 1  # the caller's setting is left as it was
    finally:
        torch.set_num_threads(previous)
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_earlier_code_path_trains_the_same_model_to_within_its_last_bits(dataset, tmp_path: Path) -> None:
    # channels_last and fused_adamw change how a step is computed, not what: the same loss at the
    # first step up to float rounding, the weights after a few steps close, and each path its own
    # bytes, the same on a rerun (both in a run's identity, so a resume refuses the other).
    earlier = {"channels_last": False, "fused_adamw": False}
    fast = run_training(dataset, tmp_path / "fast", steps=4, val_every=1)
    again = run_training(dataset, tmp_path / "again", steps=4, val_every=1)
    before = run_training(dataset, tmp_path / "earlier", steps=4, val_every=1, **earlier)
    a, b, c = (weights(tmp_path / name) for name in ("fast", "again", "earlier"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    # Over all weights: some parameters' gradients are near zero (the spatial softmax's per-map bias
    # is ignored by a softmax), and Adam scales their rounding up to steps of lr, on either path.
    difference = sum(((a[k] - c[k]) ** 2).sum() for k in a) ** 0.5
    assert difference / sum((a[k] ** 2).sum() for k in a) ** 0.5 < 1e-6
    assert fast.first_val_loss == pytest.approx(before.first_val_loss, rel=1e-6)
    assert again.best_val_loss == fast.best_val_loss
    determining = CONFIG.run_determining()
    assert determining["channels_last"] and determining["fused_adamw"]
    assert "frame_cache_mb" not in determining  # the same bytes either way


@pytest.mark.slow
def test_out_of_memory_on_one_of_two_processes_backs_off_on_both_instead_of_hanging(
    dataset, tmp_path: Path
) -> None:
    # 8 samples per step over 2 processes: 4 per process, more than rank 1 holds. Without agreeing,
    # rank 0 would wait forever in the gradient all-reduce for a rank that is retrying.
    marker = "import policypipe.training.checkpoint as checkpoint"
    assert marker in TWO_PROCESS_SCRIPT
    script = TWO_PROCESS_SCRIPT.replace(marker, RANK_1_SHORT_OF_MEMORY + marker)
    try:
        done = run_two_processes(dataset, [(tmp_path / "run", None, None)], script=script, timeout=90)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the processes hung after rank 1 ran out of memory: {exc.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    finished = sorted(line for line in done.stdout.splitlines() if line.startswith("rank"))
    assert len(finished) == 2 and all("steps 6" in line for line in finished)
    assert all(
        "out of memory at 4 samples per device: retrying with 2 and grad_accum 2" in line for line in finished
    )
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "latest").trainer["grad_accum"] == 2


def test_a_stop_request_checkpoints_off_schedule_and_the_resumed_run_matches_the_uninterrupted_one(
    dataset, tmp_path: Path
) -> None:
    """Slurm's warning signal sets the request; here it is set once step 5 is logged, so it is
    honoured at the end of step 6, off the schedule of checkpoints and validations (every 4)."""
    straight = run_training(dataset, tmp_path / "straight")
    store, stats_path = dataset
    steps_seen: list[int] = []
    interrupted = train(
        store=store,
        stats=json.loads(stats_path.read_text()),
        stats_sha256="s" * 64,
        config=CONFIG,
        run_dir=tmp_path / "run",
        log_step=lambda r: steps_seen.append(r["step"]),
        stop_requested=lambda: bool(steps_seen) and steps_seen[-1] >= 5,
    )
    assert interrupted.interrupted and interrupted.steps == 6
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "latest").trainer["step"] == 6
    resumed = run_training(dataset, tmp_path / "run")
    assert resumed.resumed_from == 6 and not resumed.interrupted
    assert all(
        torch.equal(a, b)
        for a, b in zip(weights(tmp_path / "straight").values(), weights(tmp_path / "run").values())
    )
    # No validation and no top-k slot at the interruption: the history is the uninterrupted run's.
    assert (tmp_path / "run" / "history.json").read_text() == (
        tmp_path / "straight" / "history.json"
    ).read_text()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == sorted(
        p.name for p in (tmp_path / "straight" / "checkpoints").iterdir()
    )
    assert straight.steps == resumed.steps


@pytest.mark.slow
def test_a_stop_request_on_one_rank_stops_both_at_the_same_step_and_resumes_exactly(
    two_process_runs,
) -> None:
    root, first, second = two_process_runs
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    stopped = lines_of(first, "stopped")
    assert sum("resumed_from None steps 2" in line for line in stopped) == 2, stopped  # both, at one boundary
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert sum("resumed_from 2 steps 6" in line for line in lines_of(second, "stopped")) == 2
    assert all(
        torch.equal(a, b)
        for a, b in zip(weights(root / "straight").values(), weights(root / "stopped").values())
    )


@pytest.fixture(scope="module")
def event_dataset(tmp_path_factory) -> tuple[Path, dict]:
    """Episodes of 4.3-5.3 s: the tiny store's widths close and open by 60 mm every 1.6 s."""
    from policypipe.dataset.stats import StatsConfig, compute_statistics
    from tests.dataset.conftest import make_store
    from tests.training.conftest import WINDOW

    store = tmp_path_factory.mktemp("events") / "ds.zarr"
    make_store(store, lengths=(150, 130, 160, 140, 135, 155))
    stats = compute_statistics(zarr.open_group(store, mode="r"), WINDOW, StatsConfig(val_fraction=0.34))
    return store, json.loads(json.dumps(stats | {"dataset_fingerprint": {"sha256": "f" * 64}}))


def test_the_event_loss_trains_on_the_datasets_grasps_and_releases_and_is_logged_apart(
    event_dataset, tmp_path: Path
) -> None:
    store, stats = event_dataset
    stats = json.loads(json.dumps(stats))
    records: list[dict] = []
    config = replace(
        CONFIG, steps=40, val_every=10, checkpoint_every=20, model=replace(MODEL, event_loss_weight=1.0)
    )
    result = train(
        store=store,
        stats=stats,
        stats_sha256="s" * 64,
        config=config,
        run_dir=tmp_path / "run",
        log_step=records.append,
    )
    event_losses = [r["val_event_loss"] for r in records if "val_event_loss" in r]
    assert len(event_losses) == sum("val_loss" in r for r in records) >= 3
    # The tiny store's frames are patterns that say nothing of the poses: the held-out event loss
    # is logged, not expected to fall (tests/policy/test_diffusion.py fits it).
    assert all(math.isfinite(v) for v in event_losses) and len(set(event_losses)) > 1
    assert any(name.startswith("event_head.") for name in weights(tmp_path / "run"))
    assert result.best_val_loss is not None  # the denoising loss alone, as without it

    # A training recording without a grasp is refused by name before a step is taken.
    stats["events"]["episodes"][stats["split"]["train"][0]]["missing"] = "no grasp"
    with pytest.raises(ValueError, match=r"have none: ep\d \(no grasp\)"):
        train(store=store, stats=stats, stats_sha256="s" * 64, config=config, run_dir=tmp_path / "other")
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("remember_release", [False, True])
def test_a_pretrained_frozen_encoder_is_the_one_the_policy_ends_with_and_resumes_exactly(
    event_dataset, tmp_path: Path, remember_release: bool
) -> None:
    # With remember_release each sample also reads its episode's first frame (the memory's input).
    from policypipe.policy.diffusion import DiffusionPolicy

    store, stats = event_dataset
    config = replace(
        CONFIG,
        encoder_pretrain_steps=6,
        freeze_encoder=True,
        model=replace(MODEL, event_loss_weight=1.0, remember_release=remember_release),
    )

    def run(folder: Path, stop_after=None):
        return train(
            store=store,
            stats=stats,
            stats_sha256="s" * 64,
            config=config,
            run_dir=folder,
            stop_after=stop_after,
        )

    run(tmp_path / "whole")
    final = load_checkpoint(tmp_path / "whole" / "checkpoints" / "latest")
    torch.manual_seed(CONFIG.seed)
    fresh = DiffusionPolicy(config.model).state_dict()
    encoder = [k for k in final.model if k.startswith("encoder.")]
    assert encoder and all(torch.equal(final.model[k], final.ema[k]) for k in encoder)  # frozen since
    assert any(not torch.equal(final.model[k], fresh[k]) for k in encoder)  # ... it was pretrained
    assert any(not torch.equal(final.model[k], fresh[k]) for k in final.model if k.startswith("denoiser."))

    run(tmp_path / "split", stop_after=4)
    run(tmp_path / "split")  # resumed at step 4: no second pretraining
    assert all(torch.equal(v, weights(tmp_path / "split")[k]) for k, v in weights(tmp_path / "whole").items())
