"""The privileged control under a real `dvc repro`: `train.privileged` names the sample export in
data/raw, train reads its ground truth in place of the camera, eval says why it does not evaluate
it, rollout drives it through the runner; the wrong export's settings are refused in words."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.workspace import checkout_copy, run, run_failing, shorten_training

pytestmark = pytest.mark.slow


def test_dvc_repro_trains_the_privileged_control_on_the_sample_exports_ground_truth(tmp_path) -> None:
    repo = checkout_copy(tmp_path / "checkout")
    shorten_training(repo)
    run(repo, "policypipe", "sample", "data/raw", "--recordings", "4", "--seed", "3", "--no-defects")
    run(repo, "dvc", "add", "--quiet", "data/raw")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["privileged"] = {"seed": 4, "recordings": 4, "recovery": 0.0}  # not the export's seed
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    refused = run_failing(repo, "dvc", "repro", "train")
    assert "train.privileged: " in refused.stderr
    assert "is not recording rec_0001 of the sample export with seed 4" in refused.stderr

    params["train"]["privileged"]["seed"] = 3
    params["train"]["export"] = "best"  # and the policy is the best-ranked checkpoint's, named
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = run(repo, "dvc", "repro")
    assert "eval: not run: the policy is the privileged control" in out
    config = json.loads((repo / "data/policy/config.json").read_text())["policy"]
    assert config["scene_state_dim"] == 8
    assert "not_run" in json.loads((repo / "metrics/eval.json").read_text())
    rollout = json.loads((repo / "metrics/rollout.json").read_text())
    assert sum(rollout["policy"]["outcomes"].values()) == 2  # two episodes, each with an outcome

    lineage = json.loads((repo / "data/policy/manifest.json").read_text())["lineage"]
    value, step, name = json.loads((repo / "data/train/history.json").read_text())["top_k"][0]
    assert (lineage["export"], lineage["export_step"], lineage["rank_value"]) == ("best", step, value)
    assert "exported the best-ranked checkpoint" in out
    exported = load_file(repo / "data/policy/model.safetensors")
    ema = load_file(repo / "data/train/checkpoints" / name / "ema.safetensors")
    assert all(torch.equal(exported[k], ema[k]) for k in ema) and exported.keys() == ema.keys()
