"""Agreement between processes: a stop request seen by any, and running out of memory in the first
steps, which every process must meet together or one would wait for the others forever.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Out-of-memory errors this many steps into a (re)start are met by a smaller micro-batch, on
# every process at once (see backward_agreeing_on_memory).
OOM_WINDOW_STEPS = 3


class EarlyOutOfMemory(Exception):
    pass


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("out of memory" in str(exc) or "can't allocate memory" in str(exc))
    )


def any_process(accelerator, flag: bool) -> bool:
    """True on every process if `flag` is true on any (a signal reaches each at its own time)."""
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor([float(flag)], device=accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def backward_agreeing_on_memory(
    accelerator, policy, batch: dict[str, torch.Tensor], generator: torch.Generator
) -> torch.Tensor:
    """Forward and backward of one micro-batch in the first steps of a (re)start, where running
    out of memory means backing off: all processes back off together, or none does.

    A process out of memory never reaches DDP's gradient all-reduce inside backward, and the
    others would wait for it there forever. So here gradients stay local (no_sync), the processes
    agree whether any ran out, and only then are the gradients averaged as DDP does (each divided
    by the number of processes, then summed: the same bits as DDP's for 2 processes).
    """
    ran_out = None
    try:
        with accelerator.no_sync(policy):
            loss = policy(batch, generator)
            accelerator.backward(loss)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        ran_out = exc
    world = accelerator.num_processes
    if world > 1:
        flags = torch.zeros(world, device=accelerator.device)
        flags[accelerator.process_index] = float(ran_out is not None)
        dist.all_reduce(flags)
        if ran_out is None and flags.any():
            ranks = ", ".join(str(r) for r in flags.nonzero().flatten().tolist())
            ran_out = RuntimeError(f"process {ranks} ran out of memory")
    if ran_out is not None:
        raise EarlyOutOfMemory() from ran_out
    if accelerator.sync_gradients and world > 1:
        for p in policy.parameters():
            if p.grad is not None:
                p.grad.div_(world)
                dist.all_reduce(p.grad)
    return loss
