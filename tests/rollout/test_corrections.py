"""A round of corrections (`rollout.corrections`): the policy drives, the demonstrator takes over from
its states, and each takeover is a recording that `pair` and `convert` take as any other, whose
first frame is the policy's state and whose status names the round and the policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from policypipe.atomic import write_json_atomic
from policypipe.dataset import layout
from policypipe.dataset.convert import convert_dataset
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.lineage.hashing import sha256_path
from policypipe.recordings.pairing import PairConfig, pair_export
from policypipe.rollout import corrections
from policypipe.rollout.corrections import CorrectionConfig, session_folder, write_corrections
from policypipe.runtime.runner import PolicyRunner
from tests.leftovers import group_members, wait_until_gone
from tests.runtime.test_runner import pipeline  # noqa: F401

CONFIG = CorrectionConfig(round=1, episodes=2, takeover_every_s=4.0)


@pytest.fixture(scope="module")
def round_one(pipeline, tmp_path_factory):  # noqa: F811
    export = tmp_path_factory.mktemp("export")
    folder, scenes = write_corrections(pipeline.policy, export, CONFIG, workers=1)
    return pipeline, export, folder, scenes


def test_a_round_is_a_session_of_recordings_that_pair_and_convert_take(round_one, tmp_path) -> None:
    trained, export, folder, scenes = round_one
    assert folder == export / session_folder(1)
    stems = [stem for scene in scenes for stem in scene.stems]
    assert len(stems) == 6  # at 4, 8 and 12 s of each 14 s episode: the untrained policy never lets go
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{stem}{suffix}" for stem in stems for suffix in (".mcap", "_vio.mcap", "_vio.json")
    )

    result = pair_export(export, PairConfig())
    assert sorted(r.stem for r in result.recordings) == sorted(stems)
    assert not result.rejections
    manifest = result.manifest()
    correction = manifest["recordings"][0]["status"]["correction"]
    assert correction["round"] == 1
    assert correction["policy_sha256"] == sha256_path(trained.policy)
    write_json_atomic(tmp_path / "manifest.json", manifest)
    convert_dataset(
        tmp_path / "manifest.json",
        export,
        tmp_path / "ds.zarr",
        tmp_path / "cache",
        ConvertConfig(image_size=(32, 24)),
    )
    episodes = zarr.open_group(tmp_path / "ds.zarr", mode="r").attrs[layout.ATTRS_EPISODES]
    assert sorted(e["stem"] for e in episodes) == sorted(stems)


def test_a_takeover_recording_starts_at_the_policys_state(round_one, tmp_path) -> None:
    """The recording's first pose is where the policy had the gripper at the takeover: the episode
    again (it is a pure function of the scene and the noise seed) gives the state."""
    trained, export, folder, _ = round_one
    runner = PolicyRunner.load(trained.policy, seed=CONFIG.seed)
    _, takeovers = corrections.policy_takeovers(runner, corrections.correction_scene(1, 0), 0, CONFIG)
    assert [t.t_s for t in takeovers] == pytest.approx([4.0, 8.0, 12.0], abs=0.04)
    write_json_atomic(tmp_path / "manifest.json", pair_export(export, PairConfig()).manifest())
    convert_dataset(
        tmp_path / "manifest.json",
        export,
        tmp_path / "ds.zarr",
        tmp_path / "cache",
        ConvertConfig(image_size=(32, 24)),
    )
    root = zarr.open_group(tmp_path / "ds.zarr", mode="r")
    starts = np.concatenate([[0], root[layout.EPISODE_ENDS][:-1]])
    stems = [e["stem"] for e in root.attrs[layout.ATTRS_EPISODES]]
    for takeover in takeovers:
        row = starts[stems.index(corrections.takeover_stem(1, 0, takeover.number))]
        assert np.linalg.norm(root[layout.eef_pos(0)][row] - takeover.state.position) < 0.002
        assert abs(float(root[layout.gripper_width(0)][row][0]) - takeover.state.width) < 0.002
        status = json.loads(
            (folder / f"{corrections.takeover_stem(1, 0, takeover.number)}_vio.json").read_text()
        )
        assert status["correction"]["takeover_s"] == pytest.approx(takeover.t_s, abs=1e-3)


def test_a_round_writes_the_same_bytes_again_and_is_never_overwritten(round_one, tmp_path) -> None:
    trained, export, folder, _ = round_one
    with pytest.raises(FileExistsError, match="corrections_round_01 exists"):
        write_corrections(trained.policy, export, CONFIG, workers=1)
    again, _ = write_corrections(trained.policy, tmp_path, CONFIG, workers=2)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {
        p.name: p.read_bytes() for p in folder.iterdir()
    }


def test_bad_round_settings_are_refused_in_words(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="number the rounds"):
        CorrectionConfig(round=0)
    with pytest.raises(ValueError, match="take over at least every half second"):
        CorrectionConfig(round=1, takeover_every_s=0.1)
    with pytest.raises(FileNotFoundError, match="is not an export folder"):
        write_corrections(tmp_path / "policy", tmp_path / "missing", CONFIG)


@pytest.mark.slow
def test_a_round_stopped_by_sigterm_leaves_nothing_in_the_export(pipeline, tmp_path: Path) -> None:  # noqa: F811
    # `kill` or a scheduler's stop: what the round half wrote must not stay where `dvc add` finds it.
    export = tmp_path / "export"
    export.mkdir()
    command = [sys.executable, "-m", "policypipe.cli", "corrections", str(pipeline.policy), str(export)]
    process = subprocess.Popen(
        [*command, "--round", "1", "--episodes", "8", "--workers", "1"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(export.glob(".corrections_round_01.*.partial")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(export.glob(".corrections_round_01.*.partial")), "the round never started"
        process.send_signal(signal.SIGTERM)  # the command alone, as `kill PID` does
        assert process.wait(timeout=120) == 128 + signal.SIGTERM, process.stderr.read()
        assert not wait_until_gone(lambda: group_members(process.pid), 10)
        assert list(export.iterdir()) == []
    finally:
        if group_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.stderr.close()
