"""Beyond one machine: Slurm, through submitit, as the engine of `convert` and `train`.

`resources` holds the params (what a job asks of the cluster), `slurm` submits, waits, streams
and cancels, `preemption` turns Slurm's warning signal into a checkpoint at a step boundary.
The local process pool stays the default; nothing here runs unless a stage's executor or
launcher is `slurm`.
"""
