"""`policypipe`: one subcommand per user task. The pipeline itself runs with `dvc repro`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path


def _sample(args: argparse.Namespace) -> int:
    from policypipe.synthetic.export import SampleConfig, write_sample_export

    config = SampleConfig(
        # None: SampleConfig's default, the demo export's size.
        **({} if args.recordings is None else {"recordings": args.recordings}),
        seed=args.seed,
        camera=args.camera,
        defects=args.defects,
        task=args.task,
        recovery=args.recovery,
        hand=args.hand,
        grippers=args.grippers,
        scene_camera=args.scene_camera,
    )
    t0 = time.monotonic()
    export = write_sample_export(args.out_dir, config)
    print(
        f"wrote {len(export.good_stems)} recordings"
        + (
            f" and {sum(len(v) for v in export.defects.values())} defect files ({len(export.defects)} kinds)"
            if export.defects
            else ""
        )
        + f" to {args.out_dir}: {export.files} files, "
        f"{export.bytes / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s"
    )
    return 0


def _corrections(args: argparse.Namespace) -> int:
    from collections import Counter

    from policypipe.rollout.corrections import CorrectionConfig, write_corrections

    config = CorrectionConfig(
        round=args.round,
        episodes=args.episodes,
        first_scene=args.first_scene,
        takeover_every_s=args.takeover_every,
        seed=args.seed,
        task=args.task,
    )
    t0 = time.monotonic()
    folder, scenes = write_corrections(args.policy, args.export, config, workers=args.workers or None)
    outcomes = Counter(s.policy_outcome for s in scenes)
    print(
        f"wrote {sum(len(s.stems) for s in scenes)} correction recordings to {folder} from "
        f"{len(scenes)} policy episodes ({', '.join(f'{o} {n}' for o, n in sorted(outcomes.items()))}) "
        f"in {time.monotonic() - t0:.1f} s; `dvc add {args.export}` and `dvc repro` train on them"
    )
    return 0


def _export_lerobot(args: argparse.Namespace) -> int:
    from policypipe.interop.lerobot import LeRobotExportConfig, export_lerobot

    t0 = time.monotonic()
    summary = export_lerobot(args.dataset, args.out, LeRobotExportConfig(task=args.task))
    print(
        f"wrote {summary.out}: LeRobotDataset v3.0, {summary.episodes} episodes, {summary.frames} frames "
        f"({summary.filled_slots} grid slots of dropped frames filled with the nearer frame), "
        f"{summary.bytes_written / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s"
    )
    return 0


def _pair(args: argparse.Namespace) -> int:
    from policypipe.atomic import write_json_atomic
    from policypipe.recordings.aloha import AlohaConfig
    from policypipe.recordings.hdf5 import RobomimicConfig
    from policypipe.recordings.pairing import PairConfig, pair_export, summary_lines

    cameras = {"cameras": args.cameras} if args.cameras else {}
    robomimic = RobomimicConfig(filter_key=args.filter_key, control_hz=args.control_hz, **cameras)
    aloha = AlohaConfig(control_hz=args.control_hz, **cameras)
    try:
        config = PairConfig(
            task=args.task,
            accept_truncated=args.accept_truncated,
            source=args.source,
            robomimic=robomimic,
            aloha=aloha,
        )
    except ValueError as exc:
        raise UsageError(
            str(exc).replace("set it in params.yaml [pair] aloha", "give --control-hz")
        ) from None
    result = pair_export(args.export, config)
    for line in summary_lines(result):
        print(line)
    if args.report:
        write_json_atomic(args.report, result.report())
        print(f"report: {args.report}")
    if args.verbose:
        for r in result.rejections:
            print(f"{r.path}\t{r.reason.value}\t{r.detail}")
    return 0 if result.recordings else 1


RECORDS = (Path("data/stats/stats.json"), Path("metrics/dataset.json"))


def _find_record(target: Path) -> Path | None:
    """The pipeline's record of a dataset: in the repository that holds it, or the current one."""
    for folder in [*target.resolve().parents, Path.cwd()]:
        if (folder / "dvc.yaml").is_file():
            for rel in RECORDS:
                if (folder / rel).is_file():
                    return folder / rel
    return None


def _verify(args: argparse.Namespace) -> int:
    import json

    from policypipe.dataset.verify import one_line, verify_store

    target: Path = args.path
    if (target / "manifest.json").is_file():  # an exported policy or a checkpoint
        from policypipe.atomic import verify_folder

        problems = verify_folder(target)
        if problems:
            print(f"CORRUPT {target}: " + "; ".join(problems))
            return 1
        print(f"OK {target}: every file matches its manifest")
        return 0
    if not (target / "zarr.json").is_file():
        raise UsageError(
            f"{target} is neither a dataset (zarr.json) nor a policy or checkpoint (manifest.json)"
        )
    record_path = args.record or _find_record(target)
    if record_path is None:
        raise UsageError(
            f"no record of {target} found (data/stats/stats.json or metrics/dataset.json); pass --record"
        )
    try:
        record = json.loads(Path(record_path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the record {record_path}: {one_line(exc)}") from None
    recorded = record.get("dataset_fingerprint") or {"sha256": record.get("fingerprint")}
    if not recorded.get("sha256"):
        raise UsageError(f"{record_path} holds no dataset fingerprint")
    verdict = verify_store(target, recorded)
    against = "" if verdict.status == "CORRUPT" and verdict.unopened else f" against {record_path}"
    if verdict.status != "OK":
        print(f"{verdict.status} {target}{against}: " + "; ".join(verdict.problems))
        return 1
    layout_note = "" if verdict.same_layout else " (content; stored in another layout than recorded)"
    print(f"OK {target} fingerprint {verdict.digest} matches {record_path}{layout_note}")
    return 0


def _smoke(args: argparse.Namespace) -> int:
    from policypipe.config import read_section
    from policypipe.training.config import train_config_from_params
    from policypipe.training.smoke import run_smoke

    config = train_config_from_params(read_section(args.params, "train"), read_section(args.params, "policy"))
    for path in (args.dataset, args.stats):
        if not path.exists():
            raise UsageError(f"{path} not found: run `dvc repro stats` (or `dvc pull`) first")
    print(
        f"smoke: {args.steps} steps, interrupted at {max(1, args.steps // 2)} "
        "and resumed in a fresh process ...",
        flush=True,
    )
    report = run_smoke(args.dataset, args.stats, config, steps=args.steps)  # ConfigError: other windows
    gpu = f", peak GPU memory {report.peak_gpu_mb:.0f} MB" if report.peak_gpu_mb is not None else ""
    if report.ok:
        print(
            "smoke OK: step, learning rate, loss and weights continue seamlessly "
            f"after resuming ({report.comparison}); "
            f"peak RSS {report.peak_rss_mb:.0f} MB{gpu}; {report.seconds:.0f} s"
        )
        return 0
    print("smoke FAILED: " + "; ".join(report.problems))
    return 1


def _compare(args: argparse.Namespace) -> int:
    import json

    from policypipe.atomic import write_json_atomic
    from policypipe.config import from_mapping, read_section
    from policypipe.evaluation.evaluate import EvalConfig, compare_policies, comparison_table
    from policypipe.lineage.hashing import sha256_file
    from policypipe.policy.export import load_policy, require_trained_with, with_sampling

    sides = {"A": args.a} | ({"B": args.against} if args.against else {})
    # Each input checked up front: a path that is not there is named as missing, not reported as
    # a damaged policy or an OS error from deep inside the evaluation.
    policy_fix = "pass an exported policy folder (data/policy: `dvc repro train` or `dvc pull data/policy`)"
    for path, what, fix in (
        *((p, "policy", policy_fix) for side in sides.values() for p in side),
        (args.dataset, "dataset", "run `dvc repro convert` (or `dvc pull`) first, or pass --dataset"),
        (args.stats, "statistics", "run `dvc repro stats` (or `dvc pull`) first, or pass --stats"),
    ):
        if not path.exists():
            raise UsageError(f"{what} {path} is missing: {fix}")
    for name, side in sides.items():
        resolved = [p.resolve() for p in side]
        if len(set(resolved)) < len(resolved):
            raise UsageError(
                f"side {name} lists the same policy twice: each folder must be another seed "
                "(a repeat would count one seed twice and narrow the CI)"
            )
    config = (
        from_mapping(EvalConfig, read_section(args.params, "eval"), "eval")
        if args.params.is_file()
        else EvalConfig()
    )
    loaded = {name: [load_policy(p) for p in side] for name, side in sides.items()}
    if args.sample_b:
        if "B" not in loaded:
            raise UsageError("--sample-b changes side B: give it with --against")
        changes = _sampling_changes(args.sample_b)
        loaded["B"] = [with_sampling(policy, **changes) for policy in loaded["B"]]
    stats_sha256 = sha256_file(args.stats)
    for path in (p for side in sides.values() for p in side):
        require_trained_with(path, stats_sha256, args.stats)
    stats = json.loads(args.stats.read_text())
    result = compare_policies(loaded["A"], loaded.get("B"), args.dataset, stats, config, args.held_out)
    for name, side in sides.items():
        result["sides"][name]["policies"] = [str(p) for p in side]
        print(f"{name} = " + ", ".join(str(p) for p in side))
    print("\n".join(comparison_table(result)))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"\nwritten: {args.json}")
    return 0


def _sampling_changes(assignments: list[str]) -> dict[str, object]:
    """["timestep_spacing=leading", "num_inference_steps=10"] -> typed values."""
    changes: dict[str, object] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep:
            raise ValueError(f"--sample-b {assignment!r}: expected KEY=VALUE")
        if key == "num_inference_steps":
            if not value.isdigit():
                raise ValueError(f"--sample-b {assignment!r}: num_inference_steps must be a whole number")
            changes[key] = int(value)
        else:
            changes[key] = value
    return changes


def _lineage(args: argparse.Namespace) -> int:
    import json

    from policypipe.lineage.trace import format_trace, trace

    result = trace(args.path, Path.cwd())
    print(json.dumps(result, indent=2) if args.json else format_trace(result))
    return 1 if any("missing" in link for link in result["chain"]) else 0


def _remote_add(args: argparse.Namespace) -> int:
    from policypipe.remote import add_ssh_remote

    target = add_ssh_remote(Path.cwd(), args.name, args.url, args.keyfile, default=not args.no_default)
    key_note = (
        "the URL again with the key file in .dvc/config.local (not in git)"
        if args.keyfile
        else "no key file: ssh's own choice"
    )
    print(
        f"remote {args.name!r} = {args.url} ({'default, ' if not args.no_default else ''}downloads verified) "
        "in .dvc/config; "
        f"{key_note}.\nNext: `policypipe remote check {args.name}`, then `dvc push`."
    )
    if target.user is None:
        print("note: the URL names no user: ssh uses your local user name (or ~/.ssh/config).")
    return 0


def _remote_check(args: argparse.Namespace) -> int:
    from policypipe.remote import check_host_key, config_problems, mask_url, parse_ssh_url, remote_settings

    # Warnings, not refusals: the host key decides the exit status. Printed first, since a broken
    # config.local also makes remote_settings fail.
    for problem in config_problems(Path.cwd()):
        print(f"warning: {problem}", file=sys.stderr)
    name, settings = remote_settings(Path.cwd(), args.name)
    if not settings["url"].startswith("ssh://"):
        print(f"remote {name!r} is {mask_url(settings['url'])}: not an SSH remote, no host key to check")
        return 0
    target = parse_ssh_url(settings["url"])
    port = int(settings.get("port") or target.port)
    result = check_host_key(target.host, port, args.known_hosts)
    print(result.message(args.known_hosts), file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 3


def _doctor(args: argparse.Namespace) -> int:
    import json

    from policypipe import doctor
    from policypipe.config import read_section
    from policypipe.training.config import train_config_from_params

    repo = Path.cwd()
    config = train_config_from_params(
        read_section(repo / "params.yaml", "train"), read_section(repo / "params.yaml", "policy")
    )
    convert = read_section(repo / "params.yaml", "convert")
    # What the run writes: latest and the top-k checkpoints, one more while one is being written;
    # the dataset too where it is not there yet (its size from the last conversion's metrics).
    needed = {"checkpoints": (config.keep_top_k + 2) * doctor.checkpoint_bytes(config)}
    metrics = repo / "metrics/convert.json"
    if not (repo / "data/dataset.zarr").exists() and metrics.is_file():
        m = json.loads(metrics.read_text())
        needed["dataset"] = int(m.get("frames", 0) * m.get("bytes_per_frame", 0))
    checks = [
        doctor.check_gpus,
        doctor.check_gpu_processes,
        lambda: doctor.check_disk(repo, needed),
        lambda: doctor.check_lock(repo / "requirements.lock"),
        lambda: doctor.check_remote(repo, args.known_hosts),
        lambda: doctor.check_remote_config(repo),
    ]
    if config.launcher == "slurm" or convert.get("executor") == "slurm":
        checks.append(doctor.check_slurm)
    results = doctor.run_checks(checks)
    for result in results:
        print(result.line())
    return 1 if any(r.status == "fail" for r in results) else 0


def _serve(args: argparse.Namespace) -> int:
    import math

    from policypipe.serving.server import serve_policy, ws_url

    # Refused here, before the policy loads: the bind would fail only after it.
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a TCP port is 0 to 65535 (0: any free one)")
    if not (math.isfinite(args.max_request_mb) and args.max_request_mb * 2**20 >= 1):
        raise UsageError(
            f"--max-request-mb {args.max_request_mb}: give a positive, finite size in MiB (default 64)"
        )
    # Connections, refusals and error replies, for whoever watches the server's console.
    logging.getLogger("policypipe.serving").setLevel(logging.INFO)

    def listening(host: str, port: int, metadata: dict) -> None:
        policy, runtime = metadata["policy"], metadata["runtime"]
        print(
            f"serving {args.policy} (weights sha256 {policy['weights_sha256'][:12]}..., "
            f"{runtime['frequency_hz']:.1f} Hz, chunks of {runtime['horizon']}) on {ws_url(host, port)}, "
            + ("clients need the token" if args.token_file else "no token: this machine only")
            + "; stop with Ctrl-C or SIGTERM",
            flush=True,
        )

    received = serve_policy(
        args.policy,
        host=args.host,
        port=args.port,
        token_file=args.token_file,
        max_request_bytes=round(args.max_request_mb * 2**20),
        threads=args.threads,
        on_listening=listening,
    )
    print(f"{received}: connections closed, server stopped", flush=True)


def _predict(args: argparse.Namespace) -> int:
    from policypipe.config import from_mapping, read_section
    from policypipe.progress import Progress
    from policypipe.recordings.messages import Topics
    from policypipe.runtime.predictions import PredictConfig, predict_recording

    # The recording's topics as convert reads them: params.yaml's convert.topics where there is one.
    topics = (
        from_mapping(Topics, read_section(args.params, "convert").get("topics"), "convert.topics")
        if args.params.is_file()
        else Topics()
    )
    config = PredictConfig(
        seed=args.seed, every=args.every, max_chunks=args.max_chunks, topics=topics, threads=args.threads
    )
    bar: Progress | None = None

    def on_frame(done: int, total: int, chunks: int) -> None:
        nonlocal bar
        bar = bar or Progress(total, desc="predict", unit="frame")
        bar.update(1, chunks=str(chunks))

    t0 = time.monotonic()
    try:
        summary = predict_recording(args.policy, args.recording, args.output, config, on_frame)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.monotonic() - t0
    print("\n".join(summary.lines()))
    print(
        f"{seconds:.1f} s, {summary.chunks / seconds:.1f} chunks/s; open {args.output} together with "
        f"{args.recording} in Foxglove (docs/runtime.md, 'Watching what the policy would do')"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="policypipe",
        description="Demonstrations to a trained, evaluated Diffusion Policy. "
        "Run the pipeline with `dvc repro`; "
        "these commands are the tasks around it.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "sample",
        help="write a sample export folder (recordings of a pick-and-place task)",
        description="Write a deterministic export folder in the studio's format, for demos and tests.",
    )
    p.add_argument(
        "out_dir", type=Path, metavar="OUT_DIR", help="folder to create (must not exist or be empty)"
    )
    p.add_argument(
        "--recordings", type=int, default=None, help="good recordings to write (default: the demo's, 96)"
    )
    p.add_argument("--seed", type=int, default=0, help="same seed, byte-identical files (default: 0)")
    p.add_argument(
        "--camera",
        choices=["image", "video"],
        default="image",
        help="JPEG CompressedImage or H.264 CompressedVideo (default: image)",
    )
    p.add_argument(
        "--defects",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add the broken files a real export has (default: on)",
    )
    p.add_argument("--task", default="pick_place", help="task name written to the status files")
    p.add_argument(
        "--recovery",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of the recordings stray off the plain path and correct back "
        "(recovery demonstrations; default: 0)",
    )
    p.add_argument(
        "--hand",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="this fraction of the recordings are a person's hand: grasps off the block's centre along "
        "the fingers, and half arrive above the block turned or off and correct (default: 0)",
    )
    p.add_argument(
        "--grippers",
        type=int,
        default=1,
        help="grippers side by side, each moving a block of its own (2: bimanual, recording format 2; "
        "default: 1)",
    )
    p.add_argument(
        "--scene-camera",
        action="store_true",
        help="add a fixed camera over the table (recording format 2): at 20 Hz on its own clock, "
        "absent from the second recording",
    )
    p.set_defaults(func=_sample)

    p = sub.add_parser(
        "corrections",
        help="write a round of corrections: the demonstrator taking over from the policy's own states",
        description='DAgger on the sample\'s simulator (docs/rollout.md, "Corrections"): the policy drives '
        "in new scenes, and every few seconds the scripted demonstrator takes over from where it got "
        "and finishes the task. Each takeover is written as a recording (S.mcap, S_vio.mcap, S_vio.json) "
        "in EXPORT/corrections_round_NN, which pair and convert take as any other recording.",
    )
    p.add_argument("policy", type=Path, metavar="POLICY", help="the exported policy (data/policy)")
    p.add_argument("export", type=Path, metavar="EXPORT", help="the export folder (data/raw)")
    p.add_argument("--round", type=int, required=True, help="the round's number: 1, 2, ...")
    p.add_argument("--episodes", type=int, default=50, help="scenes the policy drives in (default: 50)")
    p.add_argument("--first-scene", type=int, default=0, help="the round's first scene (default: 0)")
    p.add_argument(
        "--takeover-every",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="the demonstrator takes over at this many seconds of the policy's episode, twice that, ... "
        "(default: 2.0)",
    )
    p.add_argument("--seed", type=int, default=0, help="the policy's sampling noise (default: 0)")
    p.add_argument("--task", default="pick_place", help="task name written to the status files")
    p.add_argument("--workers", type=int, default=0, help="processes (default 0: all cores)")
    p.set_defaults(func=_corrections)

    p = sub.add_parser(
        "pair",
        help="check an export folder: what pairs, what is rejected and why",
        description="Pair S.mcap / S_vio.mcap / S_vio.json by exact stem and report every other file; "
        "with --source robomimic or aloha, list the demos or episodes of its HDF5 files and why any "
        "cannot be read.",
    )
    p.add_argument("export", type=Path, metavar="EXPORT_DIR")
    p.add_argument("--task", default=None, help="reject recordings of another task")
    p.add_argument("--accept-truncated", action="store_true", help="accept _vio.mcap files without footer")
    p.add_argument(
        "--source", choices=("mcap", "robomimic", "aloha"), default="mcap", help="what the folder holds"
    )
    p.add_argument("--filter-key", default=None, help="robomimic: only the demos of mask/FILTER_KEY")
    p.add_argument("--cameras", nargs="+", default=None, help="HDF5: the camera keys, camera 0 first")
    p.add_argument(
        "--control-hz",
        type=float,
        default=None,
        help="HDF5: the rate (robomimic: where env_args lacks it; aloha: required)",
    )
    p.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    p.add_argument("-v", "--verbose", action="store_true", help="list every rejected file")
    p.set_defaults(func=_pair)

    p = sub.add_parser(
        "verify",
        help="check a dataset, policy or checkpoint against what the pipeline recorded",
        description="Recompute a dataset's fingerprint (its logical content) and compare it with the "
        "pipeline's record: after a copy to a server, a dvc pull, or to catch corruption.",
    )
    p.add_argument(
        "path", type=Path, metavar="PATH", help="a dataset (zarr store), an exported policy or a checkpoint"
    )
    p.add_argument(
        "--record",
        type=Path,
        default=None,
        help="the record to check against (default: "
        "data/stats/stats.json or metrics/dataset.json of the repository)",
    )
    p.set_defaults(func=_verify)

    p = sub.add_parser(
        "smoke",
        help="check training end to end in a scratch folder before committing GPUs",
        description="Build the model from params.yaml, train a few steps on real batches, interrupt, "
        "resume in a fresh process and check that everything continues seamlessly. Touches no run folder.",
    )
    p.add_argument("--dataset", type=Path, default=Path("data/dataset.zarr"))
    p.add_argument("--stats", type=Path, default=Path("data/stats/stats.json"))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--steps", type=int, default=6)
    p.set_defaults(func=_smoke)

    p = sub.add_parser(
        "compare",
        help="policies against the baselines or each other, 95%% CIs over seeds, episodes and samples",
        description="Evaluate exported policies on the same held-out samples (validation, where choices are "
        "made, unless --held-out test). Each side takes one or more "
        "policy folders: the seeds of one configuration. Alone, side A is reported against the baselines "
        "(hold still, mean motion, constant velocity, nearest neighbour) with the ratio to the best one and "
        "the camera ablation "
        "gap; with --against, the difference B - A is added. Every 95% CI is a bootstrap over seeds, then "
        "episodes, then samples within them (episodes and samples shared by all quantities): with one seed "
        "per side it covers episodes and samples only, and says so.",
    )
    p.add_argument("a", type=Path, nargs="+", metavar="POLICY_A", help="side A: one policy folder per seed")
    p.add_argument(
        "--against",
        type=Path,
        nargs="+",
        default=None,
        metavar="POLICY_B",
        help="side B: one policy folder per seed",
    )
    p.add_argument(
        "--sample-b",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="side B samples this way (timestep_spacing, num_inference_steps): with the same folders on "
        "both sides, measures a sampling choice on trained policies",
    )
    p.add_argument(
        "--held-out",
        choices=["validation", "test"],
        default="validation",
        help="the side of the split to evaluate on: validation (default) for a choice, test to report "
        "a result once the choices are made",
    )
    p.add_argument("--dataset", type=Path, default=Path("data/dataset.zarr"))
    p.add_argument("--stats", type=Path, default=Path("data/stats/stats.json"))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the full result as JSON"
    )
    p.set_defaults(func=_compare)

    p = sub.add_parser(
        "doctor",
        help="check this machine before a run: GPUs, leftover GPU processes, disk, packages, remote, Slurm",
        description="Read-only checks, run from the repository root: GPUs visible and "
        "their free memory; your processes still holding GPU memory (listed with PID and command, never "
        "killed); free disk against the checkpoints (and dataset) the run will write; the lock against "
        "what is installed; the default DVC remote (SSH: reachable with a known host key); every "
        "remote's settings (no secret in .dvc/config, a .dvc/config.local that keeps older revisions "
        "loadable); Slurm, when "
        "convert.executor or train.launcher is slurm. Exit status 1 if any check fails.",
    )
    p.add_argument("--known-hosts", type=Path, default=Path.home() / ".ssh" / "known_hosts")
    p.set_defaults(func=_doctor)

    p = sub.add_parser(
        "lineage",
        help="where a policy, checkpoint or dataset came from, down to each recording",
        description="Walk back from a policy, a checkpoint or the dataset through the stages' provenance "
        "records: train run, dataset fingerprint, convert run, manifest, pair run and every recording's "
        "SHA-256, with the commit and machine of each run. Exit status 1 if a link is missing.",
    )
    p.add_argument(
        "path",
        type=Path,
        metavar="PATH",
        help="data/policy, a checkpoint folder, data/dataset.zarr or a manifest",
    )
    p.add_argument("--json", action="store_true", help="print the chain as JSON")
    p.set_defaults(func=_lineage)

    p = sub.add_parser(
        "serve",
        help="serve a policy to a robot over a websocket (msgpack; docs/serving.md)",
        description="Load an exported policy and answer its clients' observations with action chunks "
        "(policypipe.serving.client.PolicyClient, or an openpi websocket client). Binds 127.0.0.1 "
        "unless told otherwise; any other address needs --token-file. Stops on SIGTERM or Ctrl-C, "
        "closing every connection cleanly.",
    )
    p.add_argument("policy", type=Path, metavar="POLICY", help="an exported policy folder (data/policy)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1, this machine only; 0.0.0.0: every interface, "
        "needs --token-file)",
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0: any free one)")
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a file holding the token clients must send (Authorization: Bearer TOKEN)",
    )
    p.add_argument(
        "--max-request-mb",
        type=float,
        default=64.0,
        help="larger requests get an error reply (default: 64; camera frames are most of a request)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads for inference (default: one per core)"
    )
    p.set_defaults(func=_serve)

    p = sub.add_parser(
        "predict",
        help="what a policy would do along a recording, as an MCAP to open beside it in Foxglove",
        description="Stream a recording's observations through the policy's runtime in capture-time order, "
        "as a robot would feed them, and write each predicted chunk as Foxglove messages on the "
        "recording's clock: /policy/predicted (all horizon targets), /policy/executed (the steps a robot "
        "runs), /policy/width; gripper i >= 1's under /robot{i}. The same seed gives the same bytes.",
    )
    p.add_argument("policy", type=Path, metavar="POLICY", help="an exported policy folder (data/policy)")
    p.add_argument("recording", type=Path, metavar="RECORDING", help="a recording's _vio.mcap")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="OUT", help="the MCAP to write")
    p.add_argument(
        "--every",
        type=int,
        default=None,
        metavar="N",
        help="frames between two chunks (default: the policy's n_action_steps, as a robot executing each "
        "chunk asks for the next)",
    )
    p.add_argument("--seed", type=int, default=0, help="chunk i is sampled with seed + i (default: 0)")
    p.add_argument("--max-chunks", type=int, default=None, metavar="N", help="stop after N chunks")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1; the bytes are the same for the same count)",
    )
    p.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="read convert.topics from here, where it exists (default: params.yaml)",
    )
    p.set_defaults(func=_predict)

    export = sub.add_parser(
        "export",
        help="write a dataset in another tool's format (lerobot: LeRobotDataset v3.0)",
        description="Datasets for other tools (docs/interop.md).",
    ).add_subparsers(dest="format", required=True)
    p = export.add_parser(
        "lerobot",
        help="a LeRobotDataset v3.0 folder that lerobot's LeRobotDataset(repo_id, root=OUT) loads",
        description="Write DATASET (converted with convert.resample_hz, an integer rate) as a "
        "LeRobotDataset v3.0 folder: parquet data and episodes, H.264 videos per camera, stats with "
        "quantiles, and the dataset's fingerprint in meta/info.json.",
    )
    p.add_argument("dataset", type=Path, metavar="DATASET", help="a dataset (data/dataset.zarr)")
    p.add_argument("out", type=Path, metavar="OUT", help="folder to create (must not exist)")
    p.add_argument("--task", required=True, help="the task string of the demonstrations (LeRobot's task)")
    p.set_defaults(func=_export_lerobot)

    remote = sub.add_parser(
        "remote",
        help="set up an SSH remote for dvc push/pull, and check its host key",
        description="DVC remotes on an SSH server.",
    ).add_subparsers(dest="action", required=True)
    p = remote.add_parser(
        "add",
        help="add an SSH remote: URL in .dvc/config, URL and key file in .dvc/config.local",
        description="`dvc remote add` for an SSH server, with every download's hash verified; the key "
        "file's path goes to .dvc/config.local, which git ignores, with the URL again, so that older "
        "revisions, whose .dvc/config lacks the remote, still load (dvc metrics diff, plots diff, exp show).",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("url", metavar="URL", help="ssh://[user@]host[:port]/absolute/path/on/the/server")
    p.add_argument(
        "--keyfile",
        type=Path,
        default=None,
        help="private key (default: ssh's own choice, e.g. ~/.ssh/id_ed25519)",
    )
    p.add_argument("--no-default", action="store_true", help="do not make it the default remote")
    p.set_defaults(func=_remote_add)
    p = remote.add_parser(
        "check",
        help="verify the server's host key against known_hosts (dvc-ssh does not)",
        description="Compare the host key the remote's server presents with your known_hosts. Refuses "
        "(exit status 3) an unknown or changed key. Run it before `dvc push` to a new server. Also warns "
        "of a secret in .dvc/config (git tracks it) and of a .dvc/config.local that breaks older "
        "revisions, with the commands that fix them; no secret is printed.",
    )
    p.add_argument(
        "name", nargs="?", default=None, metavar="NAME", help="remote name (default: the default remote)"
    )
    p.add_argument("--known-hosts", type=Path, default=Path("~/.ssh/known_hosts").expanduser())
    p.set_defaults(func=_remote_check)
    return parser


class UsageError(Exception):
    """An input or a setup that cannot work; the message says what to change."""


# The library's errors that mean the same, by module: looked up only in modules already imported
# (an error of a module never imported cannot have been raised), so that no subcommand imports
# torch or zarr just to know them.
LIBRARY_ERRORS = (
    ("policypipe.config", "ConfigError"),
    ("policypipe.remote", "RemoteError"),
    ("policypipe.lineage.trace", "LineageError"),
    ("policypipe.dataset.errors", "DatasetError"),
    ("policypipe.recordings.messages", "RecordingError"),
    ("policypipe.training.checkpoint", "CheckpointError"),
    ("policypipe.cluster.in_job", "SlurmError"),
)


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a subcommand reports as `error: ...` with exit status 2: the errors above, a value that
    cannot work (ValueError: a bad parameter) and a file that cannot be read or written (OSError)."""
    loaded = tuple(
        getattr(sys.modules[module], name) for module, name in LIBRARY_ERRORS if module in sys.modules
    )
    return (UsageError, ValueError, OSError, *loaded)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # SIGTERM (`kill`, a scheduler stopping the job) unwinds as Ctrl-C does, so a command removes
    # what it half wrote (a round of corrections, an import) instead of leaving it in the export.
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `serve` installs its own
    try:
        return args.func(args)
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
