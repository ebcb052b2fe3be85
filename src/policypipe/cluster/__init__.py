"""Beyond one machine: Slurm, through submitit, as the engine of `convert` and `train`.

`resources` holds the params (what a job asks of the cluster). The submitting side, where
`dvc repro` runs: `submit` submits, waits, streams a job's log and cancels; `launch` decides how
the train stage starts (here, as local processes under torch's launcher, or as one Slurm job);
`convert_jobs` runs the conversion as array tasks. Inside the allocation: `in_job` runs the
stage's command as one rank of the job, requeues it after a checkpoint on Slurm's warning and
records where each segment ran; `preemption` turns that warning into a checkpoint at a step
boundary. The local process pool stays the default; nothing here submits unless a stage's
executor or launcher is `slurm`.
"""
