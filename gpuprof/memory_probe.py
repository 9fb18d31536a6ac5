"""How much memory the host and the GPU have, and how much is free: a leaf that imports nothing of gpuprof.

Both the argument checks (:func:`gpuprof.cli.require_memory`) and the out-of-memory sentence
(:func:`gpuprof.errors.out_of_memory_sentence`) need these figures; keeping them here, below
both, is what lets ``errors`` (which everything imports) sit at the bottom of the package.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["available_memory", "total_memory", "give_back_memory"]


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


def give_back_memory() -> None:
    """Hand memory that Python freed back to the system (glibc's ``malloc_trim``; a no-op elsewhere).

    glibc keeps the pages that millions of freed small objects leave in its heap for later use, so a
    process that builds and drops large tables stays as large as its largest moment plus that waste:
    the report calls this between its stages and while it reads a trace, so each stage starts from
    what is really held."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

