"""Where a process of a torchrun job runs, and joining its process group.

Used by the multi-GPU examples (``ddp_training.py``, ``allreduce_bandwidth.py``): the same
script runs as one plain process on a laptop or as rank r of a torchrun job on a node.
"""

from __future__ import annotations

import os

from .errors import GpuprofError

__all__ = ["torchrun_place", "join_group"]


def torchrun_place(torch, cpu: bool = False) -> tuple[int, int, str]:  # type: ignore[no-untyped-def]
    """(rank, world size, device) of this process as torchrun started it, or a world of one without torchrun.

    A script run plainly gets the environment torchrun would have set for one process
    (``RANK=0``, ``WORLD_SIZE=1``, a local address and port), so the same code path runs
    everywhere. On a GPU, rank r of a node uses GPU ``LOCAL_RANK``, made current here;
    asking for more ranks than GPUs is one sentence, not a CUDA error later.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cpu or not torch.cuda.is_available():
        return rank, world, "cpu"
    if local >= torch.cuda.device_count():
        raise GpuprofError(f"rank {rank} wants GPU {local}, but this machine has {torch.cuda.device_count()}.",
                           "Start no more processes per node than there are GPUs (--nproc-per-node).")
    torch.cuda.set_device(local)
    return rank, world, f"cuda:{local}"


def join_group(torch, rank: int, world: int, device: str, max_ctas: int | None = None,  # type: ignore[no-untyped-def]
               high_priority: bool = False) -> None:
    """Join the default process group: NCCL between GPUs, gloo between CPU processes.

    ``max_ctas`` caps the thread blocks (channels) of this group's NCCL collectives, through the
    ``maxCTAs`` field of the communicator's ``ncclConfig_t`` (``ProcessGroupNCCL.Options().config``);
    unlike ``NCCL_MAX_NCHANNELS`` it applies to this group alone. ``high_priority`` puts its
    collectives on a high-priority CUDA stream. Both are NCCL's: asked for on the CPU, one sentence.
    """
    from torch import distributed as dist

    gpu = device.startswith("cuda")
    options = None
    if max_ctas is not None or high_priority:
        if not gpu:
            raise GpuprofError("--max-ctas and --high-priority set NCCL's communicator; this run uses gloo on the CPU.",
                               "Run on GPUs, or leave them out.")
        options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=high_priority)
        if max_ctas is not None:
            options.config.max_ctas = max_ctas
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world,
                            device_id=torch.device(device) if gpu else None, pg_options=options)
