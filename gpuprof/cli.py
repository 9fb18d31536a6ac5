"""Small pieces every example script's command line shares."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

__all__ = ["positive_int", "nonnegative_int", "positive_float", "add_sections_argument", "resolve_sections",
           "torch_backend_or_cpu", "require_torch", "output_file", "available_memory", "total_memory",
           "require_memory", "bounded_int"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, with a one-line message otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return value


def bounded_int(limit: int, why: str, low: int = 1) -> Callable[[str], int]:
    """argparse type: a whole number from ``low`` to ``limit``; above it, one sentence saying ``why``.

    A count a reader mistypes by a few zeros (``--kernels 100000000000``) would otherwise
    start a run that never ends; the limit is stated in the message (and should be in the
    option's help), so that a reader who really wants more knows what to change.
    """

    def parse(text: str) -> int:
        value = positive_int(text) if low >= 1 else nonnegative_int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"{value:,} is above this script's limit of {limit:,} ({why})")
        return value

    parse.__name__ = "count"  # what argparse calls the type in its messages
    return parse


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be greater than 0")
    return value


def add_sections_argument(parser: argparse.ArgumentParser, sections: tuple[str, ...]) -> None:
    """``--sections a,b`` choosing among a script's named sections (default: all of them)."""
    parser.add_argument("--sections", default="all", help=f"comma-separated subset of {', '.join(sections)} (default: all)")


def resolve_sections(parser: argparse.ArgumentParser, value: str, sections: tuple[str, ...]) -> tuple[str, ...]:
    """The sections ``--sections`` named, in the order given; a parser error for unknown names."""
    chosen = sections if value == "all" else tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in chosen if s not in sections]
    if unknown or not chosen:
        parser.error(f"unknown section(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(sections)}")
    return chosen


def require_torch(script: str):  # type: ignore[no-untyped-def]
    """``import torch`` for a script that cannot run without PyTorch: one sentence, not a traceback, if it is missing."""
    from .errors import GpuprofError

    try:
        import torch
    except ImportError:
        raise GpuprofError(f"{script} needs PyTorch.", "pip install torch (a CUDA build on a GPU machine).") from None
    return torch


def torch_device(script: str, cpu: bool = False):  # type: ignore[no-untyped-def]
    """(torch, device, where) for a script that runs on the GPU when there is one: ``device`` is "cuda" or
    "cpu" (``cpu=True`` forces it), ``where`` names it for the script's first line."""
    torch = require_torch(script)
    gpu = torch.cuda.is_available() and not cpu
    return torch, ("cuda" if gpu else "cpu"), (torch.cuda.get_device_name() if gpu else "the CPU")


def torch_backend_or_cpu(choice: str | None, why: str):  # type: ignore[no-untyped-def]
    """The backend for a script that needs PyTorch on a GPU (streams, pinned tensors, its allocator).

    Falls back to the CPU as usual; a GPU reachable only through CuPy is an error that
    says ``why`` PyTorch is needed, rather than a silent CPU run on a GPU machine.
    """
    from .backend import choose_backend
    from .errors import GpuprofError

    backend = choose_backend(choice)
    if backend.is_gpu and backend.name != "torch":
        raise GpuprofError(f"{why}; CuPy alone is not enough.", "Install a CUDA build of PyTorch, or pass --backend cpu.")
    return backend


def output_file(text: str) -> Path:
    """argparse type: a file to write results to, checked before any work is done.

    Its folder must exist and be writable now: finding out after a ten-minute run that
    ``--json /no/such/dir/x.json`` cannot be written loses the run.
    """
    path = Path(text).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {folder} is not writable")
    return path


def _memory(device: str, total: bool) -> int | None:
    """Free (or total) bytes on ``device``: /proc/meminfo for the host, the driver's figures for the GPU."""
    if device == "cpu":
        key = "MemTotal:" if total else "MemAvailable:"
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[int(total)])
    except Exception:
        pass
    try:
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[int(total)])
    except Exception:
        return None


def available_memory(device: str) -> int | None:
    """Bytes that can still be allocated on ``device`` ("cuda" or "cpu"), or None if unknown.

    The host figure is the kernel's ``MemAvailable`` (free plus reclaimable cache); the
    GPU figure is the driver's free memory on the current device.
    """
    return _memory(device, total=False)


def total_memory(device: str) -> int | None:
    """Bytes of memory ``device`` ("cuda" or "cpu") has in all, or None if unknown."""
    return _memory(device, total=True)


def require_memory(nbytes: int, device: str, what: str, option: str, *, lower_bound: bool = False) -> None:
    """Refuse up front, in one sentence, a size this machine cannot hold (rather than a
    traceback from the allocator half-way through a run). ``lower_bound``: ``nbytes`` is
    the least the run needs, and the sentence says so."""
    from .errors import GpuprofError

    free = available_memory(device)
    if free is not None and nbytes > free:
        where = "host memory" if device == "cpu" else "GPU memory"
        total = total_memory(device)
        has = f"{free / 2**30:,.1f} GiB is available" + (f" (of {total / 2**30:,.1f} GiB)" if total else "")
        raise GpuprofError(f"{what} would take {'at least ' if lower_bound else ''}{nbytes / 2**30:,.1f} GiB of {where}, "
                           f"but only {has}.", f"Choose a smaller {option}.")


def torchrun_place(torch, cpu: bool = False) -> tuple[int, int, str]:  # type: ignore[no-untyped-def]
    """(rank, world size, device) of this process as torchrun started it, or a world of one without torchrun.

    A script run plainly gets the environment torchrun would have set for one process
    (``RANK=0``, ``WORLD_SIZE=1``, a local address and port), so the same code path runs
    everywhere. On a GPU, rank r of a node uses GPU ``LOCAL_RANK``, made current here;
    asking for more ranks than GPUs is one sentence, not a CUDA error later.
    """
    import os

    from .errors import GpuprofError

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


def join_group(torch, rank: int, world: int, device: str) -> None:  # type: ignore[no-untyped-def]
    """Join the default process group: NCCL between GPUs, gloo between CPU processes."""
    from torch import distributed as dist

    gpu = device.startswith("cuda")
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world,
                                         device_id=torch.device(device) if gpu else None)
