"""Corrections on the policy's own states (DAgger; with people, HG-DAgger's intervention recordings):
the policy drives in new scenes of the sample's simulator, and every `takeover_every_s` of its
episode the scripted demonstrator takes over from the state the policy reached
(`motion.plan_takeover`) and finishes the task. Each takeover is a recording of the export layout
(format 1: `S.mcap`, `S_vio.mcap`, `S_vio.json`), one session folder per round, so `pair` and
`convert` take it as any other recording: its frames start at the policy's state, its poses and
openings (what training reads as the action) are the demonstrator's from there.

The policy's own episode is not recorded: its motion is the policy's, not a label. Its status JSON
names the round, the policy (its folder's sha256), the scene and the moment of the takeover, so
the manifest, and with it every later stage's lineage, says which round and which policy made it.

Scenes: `correction_scene(round, i)` draws from SeedSequence([ROLLOUT_ENTROPY, CORRECTION_SCENES,
round, i]): never a rollout scene (those are [ROLLOUT_ENTROPY, seed]) nor a recording's. The same
policy, round and config write the same bytes.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from policypipe.lineage.hashing import sha256_path
from policypipe.rollout.episode import (
    ROLLOUT_ENTROPY,
    START_NS,
    RolloutConfig,
    episode_noise_seed,
    run_rig_plan,
)
from policypipe.synthetic.export import SampleConfig, studio_status
from policypipe.synthetic.ground_truth import RECORDING_SPACING_S, base_ns
from policypipe.synthetic.motion import MotionPlan, plan_motion, plan_takeover
from policypipe.synthetic.recording import (
    random_timing,
    simulate_recording,
    write_simulated_raw,
    write_simulated_vio,
)
from policypipe.synthetic.rig import RigPlan
from policypipe.synthetic.simulator import NS, SimState, Simulator

log = logging.getLogger(__name__)

CORRECTION_SCENES = 3  # second word of a correction scene's seed
# The policy episodes' stream clocks (`episode.stream_clocks`) take seeds from here on: far from the
# rollout stage's and the benchmarks' scenes.
EPISODE_SEED_BASE = 1 << 40
# Recordings of round r start on day 500 + r after the sample's base date (`ground_truth.base_ns`).
ROUND_DAY_OFFSET = 500


@dataclass(frozen=True)
class CorrectionConfig:
    """One round of corrections."""

    round: int  # 1, 2, ...: the session folder's number and part of every scene's seed
    episodes: int = 50  # scenes the policy drives in
    first_scene: int = 0
    takeover_every_s: float = 2.0  # the demonstrator takes over at 2 s, 4 s, ... of the policy's episode
    time_limit_s: float = 14.0  # the policy's episodes, as the rollout stage's
    seed: int = 0  # the runner's noise
    task: str = "pick_place"  # the status JSONs' task (pair.task)

    def __post_init__(self) -> None:
        if not isinstance(self.round, int) or not 1 <= self.round <= 99:
            raise ValueError(f"round={self.round!r}: number the rounds 1 to 99")
        if not isinstance(self.episodes, int) or self.episodes < 1:
            raise ValueError(f"episodes={self.episodes!r}: drive in at least one scene")
        if not 0.5 <= self.takeover_every_s < self.time_limit_s:
            raise ValueError(
                f"takeover_every_s={self.takeover_every_s}: take over at least every half second, and "
                f"within the time limit ({self.time_limit_s} s)"
            )


def session_folder(round_: int) -> str:
    return f"corrections_round_{round_:02d}"


def correction_scene(round_: int, index: int) -> MotionPlan:
    """Scene `index` of round `round_` (its demonstration plan gives the policy's start pose)."""
    seed = np.random.SeedSequence([ROLLOUT_ENTROPY, CORRECTION_SCENES, round_, index])
    return plan_motion(np.random.default_rng(seed), START_NS)


@dataclass(frozen=True)
class Takeover:
    """Where the policy was when the demonstrator took over."""

    scene: int
    number: int  # 1, 2, ... within the scene's episode
    t_s: float  # since the episode started
    state: SimState


@dataclass(frozen=True)
class SceneCorrections:
    scene: int
    policy_outcome: str  # how the policy's own episode ended (the simulator's rules)
    stems: tuple[str, ...]  # the recordings written, one a takeover


def policy_takeovers(
    runner, plan: MotionPlan, scene: int, config: CorrectionConfig
) -> tuple[str, list[Takeover]]:
    """The policy's episode in `plan`'s scene, and the states at its takeover times (until it
    released the block or the time ran out)."""
    takeovers: list[Takeover] = []

    def on_step(t_ns: int, sims: list[Simulator]) -> None:
        elapsed = (t_ns - plan.start_ns) / NS
        if not sims[0].done() and elapsed >= config.takeover_every_s * (len(takeovers) + 1):
            takeovers.append(Takeover(scene, len(takeovers) + 1, elapsed, copy.deepcopy(sims[0].state)))

    episode = RolloutConfig(time_limit_s=config.time_limit_s, frequency_hz=runner.spec.frequency_hz)
    runner.generator.manual_seed(episode_noise_seed(config.seed, scene))
    seed = EPISODE_SEED_BASE + config.round * 1_000_000 + scene
    result = run_rig_plan(runner, seed, RigPlan((plan,)), episode, False, on_step=on_step)
    return result.outcome, takeovers


def takeover_stem(round_: int, scene: int, number: int) -> str:
    return f"corr{round_:02d}_{scene:04d}_{number:02d}"


def write_takeover(
    folder: Path, plan: MotionPlan, takeover: Takeover, config: CorrectionConfig, provenance: dict[str, Any]
) -> str:
    """One takeover as a recording in `folder`: the demonstrator's motion from the policy's state."""
    seeds = np.random.SeedSequence(
        [ROLLOUT_ENTROPY, CORRECTION_SCENES, config.round, takeover.scene, takeover.number]
    ).spawn(4)
    plan_seed, timing_seed, sim_seed, status_seed = (np.random.default_rng(s) for s in seeds)
    start_ns = (
        base_ns(ROUND_DAY_OFFSET + config.round)
        + (takeover.scene * 100 + takeover.number) * RECORDING_SPACING_S * NS
    )
    s = takeover.state
    demonstrator = plan_takeover(plan_seed, start_ns, plan.scene, s)
    # The streams run from the takeover on: the recording's first frame is the policy's state.
    timing = replace(random_timing(timing_seed), camera_start_s=0.0, pose_start_s=0.0, width_start_s=0.0)
    sample = SampleConfig()
    recording = simulate_recording(
        demonstrator, timing, sim_seed, camera="image", image_size=(sample.image_width, sample.image_height)
    )
    stem = takeover_stem(config.round, takeover.scene, takeover.number)
    write_simulated_raw(folder / f"{stem}.mcap", recording)
    write_simulated_vio(folder / f"{stem}_vio.mcap", recording)
    status = studio_status(
        stem, config.task, recording.truth.frames, recording.truth.last_frame_ns, status_seed
    ) | {
        "correction": provenance
        | {
            "scene": takeover.scene,
            "takeover_s": round(takeover.t_s, 3),
            "block_held": bool(s.held),
        }
    }
    (folder / f"{stem}_vio.json").write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    return stem


_worker: dict[str, Any] = {}


def _start_worker(policy_dir: str, seed: int) -> None:
    import torch

    from policypipe.runtime.runner import PolicyRunner

    torch.set_num_threads(1)
    _worker["runner"] = PolicyRunner.load(Path(policy_dir), seed=seed)


def _scene_job(
    folder: str, scene: int, config: dict[str, Any], provenance: dict[str, Any]
) -> SceneCorrections:
    import cv2

    cv2.setNumThreads(1)
    cfg = CorrectionConfig(**config)
    plan = correction_scene(cfg.round, scene)
    outcome, takeovers = policy_takeovers(_worker["runner"], plan, scene, cfg)
    stems = tuple(
        write_takeover(Path(folder), plan, t, cfg, provenance | {"policy_outcome": outcome})
        for t in takeovers
    )
    return SceneCorrections(scene, outcome, stems)


def write_corrections(
    policy_dir: Path, export_root: Path, config: CorrectionConfig, workers: int | None = None
) -> tuple[Path, list[SceneCorrections]]:
    """Round `config.round`'s corrections as a session folder of `export_root`, which must not hold
    that round yet. Written in a hidden sibling folder renamed when complete: a killed run leaves
    nothing that pair would take for recordings. `workers` changes speed, never bytes."""
    from policypipe.processes import process_pool

    export_root = Path(export_root)
    target = export_root / session_folder(config.round)
    if target.exists():
        raise FileExistsError(
            f"{target} exists: round {config.round} was written; write the next round, or remove this "
            "folder to write it again"
        )
    if not export_root.is_dir():
        raise FileNotFoundError(f"{export_root} is not an export folder: name the folder data/raw is")
    provenance = {"round": config.round, "policy": str(policy_dir), "policy_sha256": sha256_path(policy_dir)}
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=export_root))
    scenes = list(range(config.first_scene, config.first_scene + config.episodes))
    workers = max(1, min(workers or len(os.sched_getaffinity(0)), len(scenes)))
    args = ([str(tmp)] * len(scenes), scenes, [asdict(config)] * len(scenes), [provenance] * len(scenes))
    try:
        if workers == 1:
            _start_worker(str(policy_dir), config.seed)
            results = [_scene_job(*job) for job in zip(*args)]
        else:
            import functools

            start = functools.partial(_start_worker, str(policy_dir), config.seed)
            with process_pool(workers, start) as pool:
                results = list(pool.map(_scene_job, *args))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("round %d: %d recordings in %s", config.round, sum(len(r.stems) for r in results), target)
    return target, results
