"""The GPU's clocks and its own peak memory bandwidth, as its driver reports them.

A ceiling measured on a GPU holds at the clocks it ran at: a GPU capped by power or
heat, or held at lower application clocks, measures lower ceilings, and its
measurements are not the GPU's. So chapter 0 records the clocks beside its figures,
read with ``nvidia-smi`` *while* the GPU works (an idle GPU drops its clocks within
moments, and a reading taken between measurements would show that instead).

The peak memory bandwidth the GPU reports (memory clock x bus width x 2 transfers
per clock) is the same number Nsight Systems stores as ``memoryBandwidth`` in an
export's ``TARGET_INFO_GPU`` table: the specified peak of *this* card, whatever it is.

Field names are those of ``nvidia-smi --help-query-gpu``; each is asked for on its
own, with the older spelling as a fallback, so that a field one driver does not know
costs that field only. The clock event reasons are NVML's ``nvmlClocksEventReasons``
bits (called throttle reasons before driver 535).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Any, Callable

from .backend import Backend

__all__ = ["CLOCK_FIELDS", "EVENT_REASONS", "read_clocks", "describe_event_reasons", "memory_bandwidth_gbps",
           "BANDWIDTH_HOW"]

# (key, the nvidia-smi --query-gpu names to try in order)
CLOCK_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sm_mhz", ("clocks.current.sm", "clocks.sm")),
    ("max_sm_mhz", ("clocks.max.sm",)),
    ("memory_mhz", ("clocks.current.memory", "clocks.mem")),
    ("max_memory_mhz", ("clocks.max.memory", "clocks.max.mem")),
    ("persistence_mode", ("persistence_mode",)),
    ("event_reasons", ("clocks_event_reasons.active", "clocks_throttle_reasons.active")),
)

# NVML's nvmlClocksEventReasons bits (nvml.h; NVML API reference, "ClocksEventReasons").
EVENT_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}

BANDWIDTH_HOW = "memory clock x bus width x 2 transfers per clock, as the GPU reports them"


class _Hung(Exception):
    """nvidia-smi did not answer in time: a driver that hangs once will not answer the next field either."""


def _query(smi: str, name: str, gpu: str | None, keep_busy: Callable[[], object] | None, timeout_s: float) -> str | None:
    """One field's value, or None when nvidia-smi does not know it, says N/A or fails; :class:`_Hung` when it hangs.

    nvidia-smi runs as a separate process (in its own session, so that a hung one is killed with anything it
    started), and this one keeps the GPU busy until it answers.
    """
    cmd = [smi, f"--query-gpu={name}", "--format=csv,noheader,nounits"] + (["-i", gpu] if gpu else [])
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    except OSError:
        return None
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if keep_busy is not None:
            keep_busy()
        else:
            time.sleep(0.01)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise _Hung(name)
    out, _ = proc.communicate()
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None
    value = lines[0].strip()
    return None if not value or "N/A" in value or "not a valid field" in value.lower() else value


def read_clocks(keep_busy: Callable[[], object] | None = None, *, gpu: str | None = None,
                timeout_s: float = 20.0) -> dict[str, str | None] | None:
    """The fields of :data:`CLOCK_FIELDS` from nvidia-smi, read while ``keep_busy()`` is called in a loop.

    ``keep_busy`` should queue GPU work (a matrix product) and return; it is called until
    each nvidia-smi process answers, so the GPU is working when the driver is asked. ``gpu``
    is nvidia-smi's ``-i`` (an index or ``GPU-<uuid>``); None asks for the first GPU.
    Returns None without nvidia-smi; a field nvidia-smi cannot give is None, and after one that does not
    answer within ``timeout_s``, so are all the fields after it.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out: dict[str, str | None] = {key: None for key, _ in CLOCK_FIELDS}
    try:
        for key, names in CLOCK_FIELDS:
            for name in names:
                value = _query(smi, name, gpu, keep_busy, timeout_s)
                if value is not None:
                    out[key] = value
                    break
    except _Hung:
        pass  # the fields read so far, the others None
    return out


def describe_event_reasons(mask: str | None) -> str:
    """NVML's event-reason bit mask (``0x0000000000000004``) in words; "none" when no reason is active."""
    if mask is None:
        return "not reported"
    try:
        bits = int(mask, 16)
    except ValueError:
        return mask
    if bits == 0:
        return "none"
    names = [name for bit, name in EVENT_REASONS.items() if bits & bit]
    unknown = bits & ~sum(EVENT_REASONS)
    return ", ".join(names + ([f"other bits {unknown:#x}"] if unknown else []))


def _torch_memory(backend: Backend) -> tuple[int, int] | None:
    props = backend.xp.cuda.get_device_properties(0)
    clock_khz, width = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    return (int(clock_khz), int(width)) if clock_khz and width else None


def _cupy_memory() -> tuple[int, int] | None:
    try:
        import cupy
    except ImportError:
        return None
    rt = cupy.cuda.runtime
    try:  # cudaDevAttrMemoryClockRate (kHz) and cudaDevAttrGlobalMemoryBusWidth (bits)
        clock_khz = rt.deviceGetAttribute(getattr(rt, "cudaDevAttrMemoryClockRate", 36), 0)
        width = rt.deviceGetAttribute(getattr(rt, "cudaDevAttrGlobalMemoryBusWidth", 37), 0)
    except Exception:  # no driver, no device: CuPy raises its own runtime errors
        return None
    return (int(clock_khz), int(width)) if clock_khz and width else None


def memory_bandwidth_gbps(backend: Backend) -> float | None:
    """The GPU's peak memory bandwidth in GB/s as it reports it (see :data:`BANDWIDTH_HOW`); None without a GPU
    or where neither PyTorch's device properties nor CuPy give the memory clock and bus width."""
    if not backend.is_gpu:
        return None
    found: Any = _torch_memory(backend) if backend.name == "torch" else None
    found = found or _cupy_memory()
    if not found:
        return None
    clock_khz, width_bits = found
    return clock_khz * 1e3 * width_bits * 2 / 8 / 1e9
