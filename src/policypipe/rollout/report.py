"""Many closed-loop episodes, the policy's and the references', on the same new scenes: success
rates with Wilson intervals, the failure breakdown, time to success, a contact sheet of final
frames and a few videos (the `rollout` stage).

References on the same scenes (`references`): the scene's own demonstration replayed open loop
(near 100 %, or the simulator is wrong), the nearest training demonstration replayed blind (how much
seeing matters) and holding still (0 %). Episodes run in worker processes, one policy
runner in each, with one intra-op thread: the outcomes do not depend on the number of workers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from policypipe.h264 import x264_params
from policypipe.rollout.episode import (
    EpisodeResult,
    RolloutConfig,
    episode_noise_seed,
    rollout_scene,
    run_episode,
)
from policypipe.rollout.monitoring import Watched, assess, first_alarm_s
from policypipe.rollout.references import (
    Demonstration,
    DemonstrationReplay,
    HoldStill,
    NearestDemonstrationReplay,
    nearest_demonstration,
)
from policypipe.rollout.rig import PerGripper, rig_rollout_scene, run_rig_episode
from policypipe.synthetic.simulator import OUTCOMES, PLACE_RADIUS_M, SimConfig

# Outcomes of episodes that never held the block: the rest gripped it at least once.
UNGRASPED = ("never_closed_on_block", "closed_on_nothing")
CONTROLLERS = ("policy", "demonstration_replay", "nearest_demonstration_replay", "hold_still")


@dataclass(frozen=True)
class RolloutStageConfig:
    """`rollout` section of params.yaml."""

    episodes: int = 50
    # Scenes first_seed .. first_seed + episodes - 1 (`episode.rollout_scene`: never a recording's).
    first_seed: int = 0
    time_limit_s: float = 14.0
    latency_ms: float = 0.0  # every target takes effect this much later
    # The robot-side loop sends each target latency_ms early (`episode.RolloutConfig`).
    compensate_latency: bool = True
    # The robot-side loop holds a grip against small openings at every step, with the policy's
    # `open_deadband_m` (`episode.RolloutConfig.hold_grip_m`); false: only the runner's deadband.
    hold_grip: bool = True
    max_speed_m_s: float | None = None  # None: ideal tracking
    videos: int = 3  # episodes of the policy written as MP4: failures and successes, by seed
    workers: int = 0  # processes (0: all cores); the outcomes do not depend on it
    seed: int = 0  # the policy runner's noise
    # Scenes (from first_seed) of the turn-response check (`turn_response`): does the policy follow
    # the block's turn in frames where only the block is turned? 0: not run.
    turn_response_scenes: int = 10

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.first_seed < 0 or self.videos < 0 or self.workers < 0:
            raise ValueError("rollout.episodes must be >= 1; first_seed, videos and workers >= 0")
        if self.turn_response_scenes < 0:
            raise ValueError("rollout.turn_response_scenes must be >= 0 (0: the check is not run)")
        if not self.time_limit_s > 0 or self.latency_ms < 0:
            raise ValueError("rollout.time_limit_s must be > 0 and latency_ms >= 0")
        SimConfig(int(round(self.latency_ms * 1e6)), self.max_speed_m_s)  # its checks

    def episode_config(self, frequency_hz: float, open_deadband_m: float = 0.0) -> RolloutConfig:
        """The episodes' configuration for a policy stepping at `frequency_hz` whose runtime holds
        openings below `open_deadband_m` (its spec's)."""
        return RolloutConfig(
            time_limit_s=self.time_limit_s,
            frequency_hz=frequency_hz,
            sim=SimConfig(int(round(self.latency_ms * 1e6)), self.max_speed_m_s),
            compensate_latency=self.compensate_latency,
            hold_grip_m=open_deadband_m if self.hold_grip else 0.0,
        )


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95 % with the default z)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def summary(results: list[EpisodeResult]) -> dict[str, Any]:
    """Success rate with its Wilson 95 % CI, the outcomes counted, time to success. A rig's episodes
    (`gripper_outcomes`) add `per_gripper`: each gripper's own success rate, CI, outcomes and grasp
    rate; the episode's outcome is the first failing gripper's, and it grasped when every gripper did."""
    n = len(results)
    outcomes = Counter(r.outcome for r in results)
    successes = outcomes["success"]
    low, high = wilson_interval(successes, n)
    times = [r.duration_s for r in results if r.outcome == "success"]
    missed = [m for r in results for m in r.missed_closes]
    per_gripper = [r.gripper_outcomes or (r.outcome,) for r in results]
    out = {
        "episodes": n,
        "success_rate": successes / n,
        "success_ci95": {"ci95_low": low, "ci95_high": high, "method": "Wilson score interval"},
        "outcomes": {o: outcomes[o] for o in OUTCOMES},
        # Progress short of success: episodes that gripped the block (every gripper its own) at least once.
        "grasp_rate": sum(all(o not in UNGRASPED for o in own) for own in per_gripper) / n,
        "time_to_success_s": {"mean": float(np.mean(times)), "max": float(np.max(times))} if times else None,
        "seeds": {o: [r.seed for r in results if r.outcome == o] for o in OUTCOMES if outcomes[o]},
        # Why the closes that gripped nothing missed: each grip condition's median margin (mm, and
        # degrees for the turn; a condition failed where it is negative), over every such close
        # (`Simulator.missed_closes`), and how many closes failed each.
        "missed_closes": {
            "count": len(missed),
            "median_margin_mm": _median_margins(missed, "_m", 1000.0),
            "median_margin_deg": _median_margins(missed, "_deg", 1.0),
            "failed": {k: int(sum(m[k] < 0 for m in missed)) for k in missed[0]} if missed else None,
        },
        "drops": _drops([d for r in results for d in r.releases if d["dropped"]]),
    }
    if results and results[0].gripper_outcomes:
        out["per_gripper"] = {}
        for g in range(len(results[0].gripper_outcomes)):
            own = Counter(r.gripper_outcomes[g] for r in results)
            g_low, g_high = wilson_interval(own["success"], n)
            out["per_gripper"][f"robot{g}"] = {
                "success_rate": own["success"] / n,
                "success_ci95": {"ci95_low": g_low, "ci95_high": g_high, "method": "Wilson score interval"},
                "outcomes": {o: own[o] for o in OUTCOMES},
                "grasp_rate": sum(own[o] for o in OUTCOMES if o not in UNGRASPED) / n,
            }
    return out


def _drops(drops: list[dict[str, float | bool]]) -> dict[str, Any]:
    """Where the dropped blocks were let go: how many over the mark (within PLACE_RADIUS_M of it: set
    down too high) and how many before it (opened in the carry), with the medians of the height
    and the distance from the mark in mm (None without a drop)."""

    def median_mm(key: str) -> float | None:
        return round(1000.0 * float(np.median([d[key] for d in drops])), 1) if drops else None

    over = int(sum(d["from_mark_m"] <= PLACE_RADIUS_M for d in drops))
    return {
        "count": len(drops),
        "over_the_mark": over,
        "before_the_mark": len(drops) - over,
        "median_height_mm": median_mm("height_m"),
        "median_from_mark_mm": median_mm("from_mark_m"),
    }


def _median_margins(missed: list[dict[str, float]], suffix: str, scale: float) -> dict[str, float] | None:
    """The median of each margin named with `suffix` over the missed closes, times `scale`, rounded
    to 0.1 (None without a missed close)."""
    if not missed:
        return None
    return {
        k.removesuffix(suffix): round(scale * float(np.median([m[k] for m in missed])), 1)
        for k in missed[0]
        if k.endswith(suffix)
    }


_worker: dict[str, Any] = {}


def _start_worker(policy_dir: str, stage: dict[str, Any], demonstrations: list[list[Demonstration]]) -> None:
    import torch

    from policypipe.runtime.runner import PolicyRunner

    torch.set_num_threads(1)
    _worker["demonstrations"] = demonstrations
    _worker["stage"] = RolloutStageConfig(**stage)
    _worker["runner"] = PolicyRunner.load(Path(policy_dir), seed=_worker["stage"].seed)


def _episode(controller: str, seed: int, keep_frames: bool = False) -> EpisodeResult:
    runner, stage = _worker["runner"], _worker["stage"]
    config = stage.episode_config(runner.spec.frequency_hz, runner.spec.open_deadband_m)
    grippers = len(runner.spec.grippers)
    # A fresh noise sequence per episode: an episode does not depend on which ran before it.
    runner.generator.manual_seed(episode_noise_seed(stage.seed, seed))
    if controller == "policy":
        chosen = Watched(runner)
    else:
        plans = rig_rollout_scene(seed, grippers).plans if grippers > 1 else [rollout_scene(seed)]
        references = [
            _reference(controller, plan, _worker["demonstrations"][i], config.frequency_hz)
            for i, plan in enumerate(plans)
        ]
        chosen = PerGripper(references) if grippers > 1 else references[0]
        # The monitor reads the demonstration's episode in the shadow (`monitoring`): its chunks
        # are never executed; a nominal episode of a new scene.
        shadow = controller == "demonstration_replay" and runner.monitor is not None
        chosen = Watched(chosen, runner if shadow else None)
    # A rig's scene camera is the camera after the wrist cameras (one gripper's too: `--scene-camera`).
    scene_camera = len(runner.spec.cameras) > grippers
    if grippers > 1:
        result = run_rig_episode(chosen, seed, config, grippers, scene_camera, keep_frames)
    else:
        result = run_episode(chosen, seed, config, keep_frames, scene_camera)
    return replace(result, monitor=tuple(chosen.readings))


def _reference(controller: str, plan, demonstrations: list[Demonstration], frequency_hz: float):
    """One gripper's reference controller in the scene of `plan`."""
    if controller == "demonstration_replay":
        return DemonstrationReplay(plan, frequency_hz)
    if controller == "nearest_demonstration_replay":
        position, quaternion = (a[0] for a in plan.pose_at(np.array([plan.start_ns])))
        nearest = nearest_demonstration(demonstrations, position, quaternion)
        return NearestDemonstrationReplay(nearest, plan.start_ns, position, quaternion, frequency_hz)
    return HoldStill(frequency_hz)


def run_rollouts(
    policy_dir: Path,
    stage: RolloutStageConfig,
    workers: int,
    demonstrations: list[list[Demonstration]],
    controllers: tuple[str, ...] = CONTROLLERS,
    progress: Callable[[str, EpisodeResult], None] | None = None,
) -> dict[str, list[EpisodeResult]]:
    """{controller: results by seed} over the stage's scenes; `demonstrations` are, per gripper, the
    training episodes the nearest-demonstration reference replays (`references.training_demonstrations`).
    `progress(controller, result)` after each episode, in the jobs' order (the stage's progress lines)."""
    from policypipe.processes import process_pool

    seeds = range(stage.first_seed, stage.first_seed + stage.episodes)
    jobs = [(c, s) for c in controllers for s in seeds]
    start = _initializer(policy_dir, stage, demonstrations)

    def reported(results: Iterable[EpisodeResult]) -> list[EpisodeResult]:
        """`results`, each passed to `progress` as it comes."""
        kept = []
        for (controller, _), result in zip(jobs, results):
            if progress is not None:
                progress(controller, result)
            kept.append(result)
        return kept

    if workers == 1:  # here, without starting a process (the same results: each episode is seeded)
        start()
        results = reported(_episode(c, s) for c, s in jobs)
    else:
        with process_pool(workers, start) as pool:
            results = reported(pool.map(_episode, *zip(*jobs)))
    out: dict[str, list[EpisodeResult]] = {c: [] for c in controllers}
    for (controller, _), result in zip(jobs, results):
        out[controller].append(result)
    return out


def _initializer(policy_dir: Path, stage: RolloutStageConfig, demonstrations: list[list[Demonstration]]):
    import functools

    return functools.partial(_start_worker, str(policy_dir), asdict(stage), demonstrations)


def video_seeds(results: list[EpisodeResult], count: int) -> list[int]:
    """Failures and successes alternately, `count` in all: successes by seed; failures the first of
    each kind (in OUTCOMES' order) first, then the rest by seed, so the videos show different ways
    to fail."""
    successes = [r.seed for r in results if r.outcome == "success"]
    first_of_kind = [
        next(r.seed for r in results if r.outcome == kind)
        for kind in OUTCOMES[1:]
        if any(r.outcome == kind for r in results)
    ]
    failures = first_of_kind + [
        r.seed for r in results if r.outcome != "success" and r.seed not in first_of_kind
    ]
    chosen: list[int] = []
    while len(chosen) < count and (failures or successes):
        for pool in (failures, successes):
            if pool and len(chosen) < count:
                chosen.append(pool.pop(0))
    return chosen


def record_videos(policy_dir: Path, stage: RolloutStageConfig, seeds: list[int], out_dir: Path) -> list[Path]:
    """The policy's episodes of `seeds` again (the same frames: an episode is a pure function of its
    seed), as H.264 MP4 at the camera's rate, the same bytes every run (policypipe.h264)."""
    import av
    import cv2

    _start_worker(str(policy_dir), asdict(stage), [])
    rate = int(round(_worker["runner"].spec.frequency_hz))
    written = []
    for seed in seeds:
        result = _episode("policy", seed, keep_frames=True)
        path = out_dir / f"policy_seed{seed:04d}_{result.outcome}.mp4"
        partial = path.with_name(path.name + ".partial")
        with av.open(str(partial), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=rate)
            stream.height, stream.width = result.frames[0].shape[:2]
            stream.pix_fmt = "yuv420p"
            stream.codec_context.thread_count = 1
            stream.options = {"crf": "23", "preset": "veryfast", "x264-params": x264_params()}
            alarmed = alarmed_frames(result)
            for i, frame in enumerate(result.frames):
                if alarmed[i]:  # the monitor's alarm stands: an orange frame and the word
                    frame = frame.copy()
                    cv2.rectangle(frame, (0, 0), (frame.shape[1] - 1, frame.shape[0] - 1), (255, 140, 0), 4)
                    cv2.putText(
                        frame, "monitor alarm", (8, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 140, 0), 1
                    )
                yuv = cv2.cvtColor(frame, cv2.COLOR_RGB2YUV_I420)
                video_frame = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
                video_frame.pts = i
                container.mux(stream.encode(video_frame))
            container.mux(stream.encode(None))
        partial.replace(path)  # whole videos only
        written.append(path)
    return written


def alarmed_frames(result: EpisodeResult) -> list[bool]:
    """Per kept frame: whether the monitor's latest reading at or before it was an alarm."""
    times = [t for t, _ in result.monitor]
    out = []
    for s in result.frame_times_s:
        latest = int(np.searchsorted(times, s, side="right")) - 1
        out.append(latest >= 0 and bool(result.monitor[latest][1].alarm))
    return out


def contact_sheet(results: list[EpisodeResult], path: Path, columns: int = 10) -> Path:
    """The final frames of the episodes, a grid in seed order, each labelled with its outcome."""
    import cv2

    tiles = []
    for r in results:
        tile = cv2.resize(r.final_frame, (160, 120), interpolation=cv2.INTER_AREA)[..., ::-1].copy()
        colour = (60, 180, 60) if r.outcome == "success" else (40, 40, 220)
        cv2.rectangle(tile, (0, 0), (159, 119), colour, 3)
        if (alarm := first_alarm_s(r.monitor)) is not None:  # the monitor's first alarm, orange
            cv2.rectangle(tile, (3, 3), (76, 16), (0, 140, 255), -1)
            cv2.putText(tile, f"alarm {alarm:.1f} s", (5, 13), cv2.FONT_HERSHEY_SIMPLEX, 0.33, (0, 0, 0), 1)
        cv2.putText(
            tile, f"{r.seed} {r.outcome}", (5, 112), cv2.FONT_HERSHEY_SIMPLEX, 0.33, (255, 255, 255), 1
        )
        tiles.append(tile)
    columns = min(columns, len(tiles))
    rows = math.ceil(len(tiles) / columns)
    sheet = np.zeros((rows * 120, columns * 160, 3), np.uint8)
    for i, tile in enumerate(tiles):
        sheet[
            (i // columns) * 120 : (i // columns + 1) * 120, (i % columns) * 160 : (i % columns + 1) * 160
        ] = tile
    if not cv2.imwrite(str(path), sheet):
        raise OSError(f"could not write {path}")
    return path


def report(
    results: dict[str, list[EpisodeResult]],
    stage: RolloutStageConfig,
    calibration=None,
) -> dict[str, Any]:
    """metrics/rollout.json: one summary a controller, the policy's first; what the scenes were; the
    monitor's figures where the policy has one (`monitoring.assess`; `calibration`: the policy's,
    `monitor.scores.Calibration`)."""
    first = stage.first_seed
    rig = bool(results["policy"] and results["policy"][0].gripper_outcomes)
    rule = (
        "rig.rig_rollout_scene: plan_rig with SeedSequence([ROLLOUT_ENTROPY, RIG_SCENES, grippers, seed])"
        if rig
        else "episode.rollout_scene: plan_motion with SeedSequence([ROLLOUT_ENTROPY, seed])"
    )
    return (
        {
            "scenes": {"seeds": [first, first + stage.episodes - 1], "rule": rule},
            "time_limit_s": stage.time_limit_s,
            "latency_ms": stage.latency_ms,
            "compensate_latency": stage.compensate_latency,
            "hold_grip": stage.hold_grip,
            "max_speed_m_s": stage.max_speed_m_s,
        }
        | {c: summary(results[c]) for c in CONTROLLERS}
        | {"monitor": assess(results["policy"], results.get("demonstration_replay", []), calibration)}
    )
