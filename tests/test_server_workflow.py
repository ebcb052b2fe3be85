"""docs/cluster.md, "Server", step by step: a laptop with the export, a GPU server with only the dataset.

Three real git repositories (a bare one as the shared origin) and the SSH remote on a loopback
sshd. The "laptop" pairs, converts and computes the statistics, then pushes; the "server"
clones, pulls only what training needs (never data/raw), trains and evaluates with `dvc repro
--allow-missing` (pair and convert are skipped, their input is not there), and pushes; the
laptop pulls the policy, verifies it and walks its lineage down to the recordings. The one
The step not taken here is `make setup`: the server uses this test's environment.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.sshd import LoopbackSshd
from tests.workspace import checkout_copy, run, shorten_training, stages_run

pytestmark = pytest.mark.slow


def test_the_server_trains_without_the_export_and_the_laptop_pulls_a_verified_policy(
    sshd: LoopbackSshd, tmp_path: Path
) -> None:
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    remote = tmp_path / "dvc-remote"
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{remote}"

    laptop = checkout_copy(tmp_path / "laptop")
    shorten_training(laptop)
    run(laptop, "git", "remote", "add", "origin", str(origin))
    run(laptop, "policypipe", "sample", "data/raw", "--recordings", "3", "--seed", "7")
    run(laptop, "dvc", "add", "--quiet", "data/raw")
    run(
        laptop, "policypipe", "remote", "add", "server", url, "--keyfile", str(sshd.client_key)
    )  # make remote
    run(laptop, "dvc", "repro", "stats")
    run(laptop, "git", "add", "-A")
    run(laptop, "git", "commit", "-qm", "dataset and statistics")
    run(laptop, "git", "push", "-q", "origin", "main")
    run(laptop, "dvc", "push")

    # The server: a clone, its own key for the remote, only the dataset and the statistics.
    server = tmp_path / "server"
    run(tmp_path, "git", "clone", "-q", str(origin), str(server))
    # The URL in config.local too, as `policypipe remote add` writes it: a local section with only
    # the key would make every revision from before the remote unloadable (docs/lineage.md).
    url = run(server, "dvc", "config", "--project", "remote.server.url").strip()
    run(server, "dvc", "remote", "modify", "--local", "server", "url", url)
    run(server, "dvc", "remote", "modify", "--local", "server", "keyfile", str(sshd.client_key))
    run(server, "dvc", "pull", "data/dataset.zarr", "data/stats")
    assert not (server / "data/raw").exists() and not (server / "data/manifest.json").exists()
    shown = run(server, "dvc", "repro", "--allow-missing")
    assert "Running stage 'train'" in shown and "Running stage 'eval'" in shown
    assert "Running stage 'pair'" not in shown and "Running stage 'convert'" not in shown
    assert not (server / "data/raw").exists()
    log = [json.loads(line) for line in (server / "data/train/log.jsonl").read_text().splitlines()]
    assert (
        log[-1]["step"] == json.loads((server / "metrics/train.json").read_text())["steps"]
    )  # the monitoring file
    run(server, "git", "add", "-A")
    run(server, "git", "commit", "-qm", "trained on the server")
    run(server, "git", "push", "-q", "origin", "main")
    run(server, "dvc", "push")

    # Back on the laptop: the server's results, verified, and their lineage down to the recordings.
    run(laptop, "git", "pull", "-q", "origin", "main")
    run(laptop, "dvc", "pull", "data/policy")
    assert run(laptop, "policypipe", "verify", "data/policy").startswith("OK")
    assert (laptop / "data/policy/model.safetensors").read_bytes() == (
        server / "data/policy/model.safetensors"
    ).read_bytes()
    lineage = run(laptop, "policypipe", "lineage", "data/policy")
    manifest = json.loads((laptop / "data/manifest.json").read_text())
    for recording in manifest["recordings"]:
        for f in recording["files"].values():
            assert f"{f['sha256']}  {f['path']}" in lineage
    # Nothing for the laptop to rerun (the checkpoints stay on the remote until pulled).
    assert stages_run(run(laptop, "dvc", "repro", "--dry", "--allow-missing")) == ["check_export"]
