"""`convert.executor: slurm`: the recordings converted by Slurm array tasks into the cache.

Each task converts a batch of recordings with the local process pool of its own node into
the content-addressed cache on the shared filesystem, exactly as a local run would; the stage
then assembles the store on the submitting node from that cache, so the dataset's bytes do not
depend on the executor. A task that ends without a result (killed, node failure, time limit)
is run again, each of its recordings in a task of its own, `retries` times; a recording whose
task still fails is excluded with the reason `slurm_task_failed`, and the others are kept.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policypipe.cluster import submit
from policypipe.dataset.convert_cache import RecordingInput, cache_key, record_of
from policypipe.dataset.convert_config import ConvertConfig
from policypipe.dataset.convert_workers import convert_recordings

log = logging.getLogger(__name__)

JOBS_FOLDER = "slurm-jobs"  # beside the cache's converter folders: submitit's pickles and the tasks' logs


def convert_batch(
    inputs: list[RecordingInput], config: ConvertConfig, cache_dir: Path
) -> list[dict[str, Any]]:
    """One array task: its recordings into the cache, by as many processes as it has CPUs."""
    # The task's own process: its log (submitit's .err file) says what it converts.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for rec in inputs:
        log.info("converting %s", rec.stem)  # the task's log names what it works on
    return convert_recordings(
        inputs, dataclasses.replace(config, workers=config.slurm.cpus_per_task), cache_dir
    )


@dataclasses.dataclass
class SlurmConversion:
    """A Runner for `convert_dataset`; `attempts` says afterwards which tasks ran, and how they ended."""

    jobs_folder: Path
    poll_s: float = 1.0
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __call__(
        self,
        inputs: list[RecordingInput],
        config: ConvertConfig,
        cache_dir: Path,
        progress: Callable[[dict], None] | None,
    ) -> list[dict[str, Any]]:
        resources = submit.local_resources(config.slurm)
        config = dataclasses.replace(config, slurm=resources)
        submit.check_reachable()
        shutil.rmtree(self.jobs_folder, ignore_errors=True)  # the last run's task files only
        size = resources.recordings_per_task
        pending = [
            list(range(start, min(start + size, len(inputs)))) for start in range(0, len(inputs), size)
        ]
        records: dict[int, dict[str, Any]] = {}
        failures: dict[int, str] = {}
        for attempt in range(resources.retries + 1):
            failed = self._run_array(attempt, pending, inputs, config, cache_dir, records, progress)
            failures = {i: why for batch, why in failed for i in batch}
            if not failed:
                break
            # Again, each recording alone: one that kills its task then takes no other with it.
            pending = [[i] for batch, _ in failed for i in batch]
            log.warning(
                "%d Slurm task(s) failed (%s); running their %d recording(s) again, one per task",
                len(failed),
                failed[0][1],
                len(pending),
            )
        for i, why in failures.items():
            rec = inputs[i]
            log.error("%s: its Slurm task failed %d time(s): %s", rec.stem, resources.retries + 1, why)
            records[i] = record_of(rec, cache_key(rec, config)) | {
                "excluded": "slurm_task_failed",
                "detail": f"the Slurm task converting it failed {resources.retries + 1} time(s); "
                f"the last: {why}. "
                "Not cached: rerun the stage to try again, or look at the recording",
            }
            if progress is not None:
                progress(records[i])
        return [records[i] for i in range(len(inputs))]

    def _run_array(
        self,
        attempt: int,
        batches: list[list[int]],
        inputs: list[RecordingInput],
        config: ConvertConfig,
        cache_dir: Path,
        records: dict[int, dict[str, Any]],
        progress: Callable[[dict], None] | None,
    ) -> list[tuple[list[int], str]]:
        resources = config.slurm
        executor = submit.make_executor(
            self.jobs_folder / f"attempt-{attempt}",
            job_name="policypipe-convert",
            partition=resources.partition,
            account=resources.account,
            qos=resources.qos,
            cpus_per_task=resources.cpus_per_task,
            mem_gb=resources.mem_gb,
            time_min=resources.time_min,
            array_parallelism=resources.max_concurrent,
        )
        jobs = executor.map_array(
            convert_batch,
            [[inputs[i] for i in b] for b in batches],
            [config] * len(batches),
            [cache_dir] * len(batches),
        )
        log.info("submitted %d array task(s) as Slurm job %s", len(jobs), jobs[0].job_id.split("_")[0])
        batch_of = {job.job_id: batch for job, batch in zip(jobs, batches)}
        failed: list[tuple[list[int], str]] = []

        def collect(job) -> None:
            result = submit.outcome(job)
            batch = batch_of[job.job_id]
            self.attempts.append(
                {
                    "attempt": attempt,
                    "job": job.job_id,
                    "recordings": [inputs[i].stem for i in batch],
                    "ok": result.ok,
                    **({} if result.ok else {"why": result.value}),
                }
            )
            if not result.ok:
                failed.append((batch, result.value))
                return
            for i, record in zip(batch, result.value):
                records[i] = record
                if progress is not None:
                    progress(record)

        submit.wait(jobs, on_finished=collect, poll_s=self.poll_s)
        return failed
