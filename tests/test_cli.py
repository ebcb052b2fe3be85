"""`policypipe verify` and `compare` on damaged or missing inputs: a line that names the problem,
never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from policypipe.atomic import write_json_atomic
from policypipe.cli import main
from policypipe.dataset.fingerprint import fingerprint, store_files
from tests.dataset.conftest import make_store

SHARD = "data/camera0_rgb/c/1/0/0/0"  # frames 10-19 of the image array
CHUNK = "data/robot0_eef_pos/c/1/0"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny store, the pipeline's record of it (with every file's hash), and a record without files."""
    root = tmp_path_factory.mktemp("recorded")
    make_store(root / "ds.zarr")
    fp = fingerprint(root / "ds.zarr")
    full = {
        "dataset_fingerprint": {
            "sha256": fp.digest,
            "arrays": fp.arrays,
            "files": store_files(root / "ds.zarr"),
        }
    }
    write_json_atomic(root / "stats.json", full)
    write_json_atomic(
        root / "dataset.json", {"fingerprint": fp.digest}
    )  # metrics/dataset.json holds only the digest
    return root / "ds.zarr", root / "stats.json", root / "dataset.json"


@pytest.fixture
def store(recorded, tmp_path: Path) -> Path:
    shutil.copytree(recorded[0], tmp_path / "ds.zarr")
    return tmp_path / "ds.zarr"


def verify(store: Path, record: Path, capsys) -> tuple[int, str, str]:
    code = main(["verify", str(store), "--record", str(record)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_verify_still_says_ok_on_an_intact_copy(recorded, store: Path, capsys) -> None:
    for record in recorded[1:]:
        code, out, _ = verify(store, record, capsys)
        assert code == 0 and out.startswith("OK ")


@pytest.mark.parametrize("deleted", [SHARD, CHUNK])
@pytest.mark.parametrize("record", ["files recorded", "digest only"])
def test_verify_names_a_deleted_chunk_file(recorded, store: Path, capsys, deleted: str, record: str) -> None:
    (store / deleted).unlink()
    code, out, err = verify(store, recorded[1] if record == "files recorded" else recorded[2], capsys)
    assert code == 1, out + err
    assert out.startswith("CORRUPT ") and f"{deleted}: missing" in out


@pytest.mark.parametrize("metadata", ["zarr.json", "data/robot0_eef_pos/zarr.json", "data/zarr.json"])
@pytest.mark.parametrize("record", ["files recorded", "digest only"])
def test_verify_reports_a_garbage_zarr_json_as_corrupt(
    recorded, store: Path, capsys, metadata: str, record: str
) -> None:
    (store / metadata).write_bytes(bytes(range(256)) * 3)  # not JSON, not even UTF-8
    code, out, err = verify(store, recorded[1] if record == "files recorded" else recorded[2], capsys)
    assert code == 1, out + err
    assert out.startswith("CORRUPT ") and f"{metadata}: " in out


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    from policypipe.policy.diffusion import DiffusionPolicy
    from policypipe.policy.export import save_policy
    from tests.training.conftest import MODEL

    folder = tmp_path_factory.mktemp("policy") / "policy"
    save_policy(folder, DiffusionPolicy(MODEL), {})
    return folder


@pytest.mark.parametrize("missing", ["a", "b", "dataset", "stats"])
def test_compare_with_a_missing_input_says_which_is_missing(
    recorded, policy: Path, tmp_path: Path, capsys, missing: str
) -> None:
    paths = {"a": policy, "b": policy, "dataset": recorded[0], "stats": recorded[1]} | {
        missing: tmp_path / "nowhere"
    }
    code = main(
        [
            "compare",
            str(paths["a"]),
            "--against",
            str(paths["b"]),
            "--dataset",
            str(paths["dataset"]),
            "--stats",
            str(paths["stats"]),
            "--params",
            str(tmp_path / "params.yaml"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and f"{tmp_path / 'nowhere'} is missing" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    """A tiny store, its statistics, and two untrained policies of one configuration (two seeds)."""
    import torch
    import zarr

    from policypipe.dataset.stats import StatsConfig, compute_statistics
    from policypipe.dataset.windows import WindowConfig
    from policypipe.lineage.hashing import sha256_file
    from policypipe.policy.diffusion import DiffusionPolicy
    from policypipe.policy.export import save_policy
    from tests.training.conftest import MODEL

    root = tmp_path_factory.mktemp("seeds")
    make_store(root / "ds.zarr", lengths=(30, 25, 40, 35, 28, 33))
    stats = compute_statistics(
        zarr.open_group(root / "ds.zarr", mode="r"), WindowConfig(2, 8, 4), StatsConfig(val_fraction=0.4)
    )
    write_json_atomic(root / "stats.json", stats)
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        policy = DiffusionPolicy(MODEL)
        policy.fit_normalizers(stats)
        folders.append(
            save_policy(
                root / f"policy_seed{seed}", policy, {"stats_sha256": sha256_file(root / "stats.json")}
            )
        )
    return root / "ds.zarr", root / "stats.json", folders


def compare(seeds, args: list[str], tmp_path: Path) -> int:
    (tmp_path / "params.yaml").write_text(
        "eval:\n  stride: 6\n  batch_size: 32\n  bootstrap_resamples: 200\n"
    )
    return main(
        [
            "compare",
            *args,
            "--dataset",
            str(seeds[0]),
            "--stats",
            str(seeds[1]),
            "--params",
            str(tmp_path / "params.yaml"),
        ]
    )


def test_compare_one_seed_alone_against_the_baselines_says_what_the_ci_covers(
    seeds, tmp_path: Path, capsys
) -> None:
    code = compare(seeds, [str(seeds[2][0]), "--json", str(tmp_path / "out.json")], tmp_path)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "A: 1 seed; CIs cover episodes, then samples within them (one seed; " in out
    for name in (
        "hold_still",
        "mean_motion",
        "constant_velocity",
        "nearest_neighbour",
        "ratio to best baseline",
        "camera ablation gap",
    ):
        assert name in out
    result = json.loads((tmp_path / "out.json").read_text())
    side = result["sides"]["A"]
    assert side["policies"] == [str(seeds[2][0])] and "b_minus_a" not in result
    assert side["components"]["position_mm"]["best_baseline"] in {
        "hold_still",
        "mean_motion",
        "constant_velocity",
        "nearest_neighbour",
    }


def test_compare_chooses_on_validation_and_reports_the_test_side_when_asked(
    seeds, tmp_path: Path, capsys
) -> None:
    stats = json.loads(seeds[1].read_text())
    for held_out, episodes in (([], stats["split"]["val"]), (["--held-out", "test"], stats["split"]["test"])):
        code = compare(seeds, [str(seeds[2][0]), *held_out, "--json", str(tmp_path / "out.json")], tmp_path)
        out = capsys.readouterr().out
        side = "test" if held_out else "validation"
        assert code == 0 and f"samples of {len(episodes)} {side} episodes" in out
        assert json.loads((tmp_path / "out.json").read_text())["held_out"] == side


def test_compare_seeds_against_seeds(seeds, tmp_path: Path, capsys) -> None:
    a, b = seeds[2]
    code = compare(
        seeds, [str(a), str(b), "--against", str(b), "--json", str(tmp_path / "out.json")], tmp_path
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "A: 2 seeds; CIs cover seeds, episodes, then samples within them (A: 2 seeds; " in out
    assert "B - A; CIs cover seeds, episodes, then samples within them (A: 2 seeds, B: 1 seed; " in out
    result = json.loads((tmp_path / "out.json").read_text())
    assert set(result["b_minus_a"]) == {"position_mm", "rotation_deg", "width_mm"}


def test_compare_refuses_one_seed_listed_twice(seeds, tmp_path: Path, capsys) -> None:
    code = compare(seeds, [str(seeds[2][0]), str(seeds[2][0])], tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and "side A lists the same policy twice" in err


def test_compare_refuses_a_policy_trained_with_other_statistics(seeds, tmp_path: Path, capsys) -> None:
    # Other statistics mean another split: the "held-out" episodes may be ones it trained on.
    other = tmp_path / "stats.json"
    other.write_text(seeds[1].read_text().replace('"seed": 0', '"seed": 1', 1))
    code = main(
        [
            "compare",
            str(seeds[2][0]),
            "--dataset",
            str(seeds[0]),
            "--stats",
            str(other),
            "--params",
            str(tmp_path / "params.yaml"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "was trained with statistics" in err and str(other) in err and "--stats" in err


def test_compare_measures_a_sampling_choice_on_the_same_trained_policies(
    seeds, tmp_path: Path, capsys
) -> None:
    policies = [str(p) for p in seeds[2]]
    code = compare(
        seeds,
        [
            *policies,
            "--against",
            *policies,
            "--sample-b",
            "timestep_spacing=leading",
            "--json",
            str(tmp_path / "out.json"),
        ],
        tmp_path,
    )
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["b_minus_a"]["position_mm"]["mean"] != 0  # other diffusion steps, other samples
    code = compare(
        seeds, [*policies, "--against", *policies, "--sample-b", "normalization=mean_std"], tmp_path
    )
    err = capsys.readouterr().err
    assert code == 2 and "normalization changes what the policy learned" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["remote", "add", "x", "http://nope"], "'http://nope' is not an SSH remote URL"),  # RemoteError
        (["lineage", "{tmp}/nowhere"], "{tmp}/nowhere does not exist"),  # LineageError
        (["pair", "{tmp}/nowhere"], "export folder {tmp}/nowhere does not exist"),  # ValueError
        (["pair", "{tmp}", "--source", "aloha"], "aloha.control_hz is required: ALOHA files do not hold"),
        (["sample", "{tmp}", "--recordings", "1"], "{tmp} is not empty"),  # FileExistsError
        (["serve", "{tmp}/nowhere"], "policy folder {tmp}/nowhere does not exist"),  # FileNotFoundError
        (["predict", "{tmp}", "{tmp}/something", "-o", "{tmp}/p.mcap"], "{tmp} has no runtime.json"),
    ],
)
def test_every_subcommand_reports_a_bad_input_as_one_error_line_with_status_2(
    tmp_path: Path, monkeypatch, capsys, argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "something").write_text("")
    code = main([arg.format(tmp=tmp_path) for arg in argv])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("error: ") and message.format(tmp=tmp_path) in captured.err
    assert captured.err.count("\n") == 1


def test_a_bug_is_not_dressed_up_as_a_bad_input(monkeypatch) -> None:
    import policypipe.cli

    def broken(_args) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(policypipe.cli, "_lineage", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["lineage", "anything"])


def test_the_library_errors_reported_as_bad_inputs_are_where_the_cli_looks_for_them() -> None:
    import importlib

    from policypipe.cli import LIBRARY_ERRORS

    for module, name in LIBRARY_ERRORS:  # an error class that moved would be reported as a traceback
        assert issubclass(getattr(importlib.import_module(module), name), Exception), (module, name)
