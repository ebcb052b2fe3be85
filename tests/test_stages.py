"""What the stage scripts share (stages/common.py), under a real `dvc repro`."""

from __future__ import annotations

import pytest
import yaml

from policypipe.lineage.hashing import sha256_path
from tests.workspace import checkout_copy, run, run_failing

pytestmark = pytest.mark.slow


def test_a_refused_stage_says_dvc_removed_its_dataset_and_how_to_bring_it_back(tmp_path) -> None:
    repo = checkout_copy(tmp_path / "checkout")
    run(repo, "policypipe", "sample", "data/raw", "--recordings", "2", "--seed", "3", "--no-defects")
    run(repo, "dvc", "add", "--quiet", "data/raw")
    run(repo, "dvc", "repro", "convert")
    made = sha256_path(repo / "data/dataset.zarr")

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["convert"]["image_size"] = [4, 4]  # refused: below 8 pixels
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    refused = run_failing(repo, "dvc", "repro", "convert")
    assert "image_size must be [width, height] between 8 and 4096" in refused.stderr
    # DVC deletes a stage's outputs before running it: the message must not promise the old dataset.
    assert not (repo / "data/dataset.zarr").exists()
    assert "DVC removed data/dataset.zarr before running the stage" in refused.stderr
    assert "`dvc checkout data/dataset.zarr` brings it back" in refused.stderr

    run(repo, "dvc", "checkout", "data/dataset.zarr")
    assert sha256_path(repo / "data/dataset.zarr") == made
