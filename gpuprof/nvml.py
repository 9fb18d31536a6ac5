"""The GPU's SM clock, power and clock-event reasons *while* a kernel is timed, read from NVML.

A rate measured under a power cap is a rate at a lower clock: two kernels compared in one run
may even run at different clocks, the one that draws more power at the lower. So a timed run
records, beside each kernel's time, what the driver said during exactly that time window:

* the SM clock (``nvmlDeviceGetClockInfo``, ``NVML_CLOCK_SM``), sampled every ``period_s`` by a
  thread, so that a rate can also be stated per cycle (rate / clock);
* the average power over the window from the board's energy counter
  (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded, Volta and newer),
  and the mean of ``nvmlDeviceGetPowerUsage``, which on Ampere (except GA100) and newer GPUs is
  itself an average over the last second (NVML API reference), so it lags a short window;
* the clock-event (throttle) reasons, OR-ed over the window (``0x4``: software power cap), in
  words through :func:`gpuprof.device_state.describe_event_reasons`;
* the power limit the driver enforces (``nvmlDeviceGetEnforcedPowerLimit``), read once: a power
  near it, with reason ``0x4``, is a capped run, not a slow kernel.

NVML is the driver's own library (``libnvidia-ml.so.1``), loaded with ctypes: no Python package
is needed, and without the driver :meth:`Nvml.open` says why and returns None.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from .device_state import describe_event_reasons

__all__ = ["Sample", "Nvml", "Sampler", "summarise", "window_power_w", "describe_window", "torch_pci_bus_id", "open_sampler", "torch_sampler"]

NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2  # nvmlClockType_t
NVML_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t


@dataclass(frozen=True)
class Sample:
    """One reading; a field the driver would not give is None."""

    t: float  # time.monotonic() seconds
    sm_mhz: int | None
    power_w: float | None  # nvmlDeviceGetPowerUsage (an average over about a second on recent GPUs)
    energy_j: float | None  # the board's energy counter
    reasons: int | None  # nvmlClocksEventReasons bit mask
    temp_c: int | None


class Nvml:
    """One GPU's NVML counters. ``lib`` is the loaded library (a stand-in in tests)."""

    def __init__(self, lib: Any, handle: Any) -> None:
        self.lib, self.handle = lib, handle
        self._reasons = (getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None))  # the name before driver 535

    @classmethod
    def open(cls, pci_bus_id: str | None = None, index: int = 0, lib: Any = None) -> tuple[Nvml | None, str]:
        """NVML for the GPU at ``pci_bus_id`` (CuPy's ``Device().pci_bus_id``; CUDA's and NVML's numbering
        differ under CUDA_VISIBLE_DEVICES) or NVML index ``index``; (None, why) where it cannot."""
        try:
            lib = lib or ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as exc:
            return None, f"no NVML library here ({exc})"
        rc = lib.nvmlInit_v2()
        if rc != 0:
            return None, f"nvmlInit_v2 returned {rc}"
        handle = ctypes.c_void_p()
        if pci_bus_id:
            rc = lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle))
        else:
            rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        if rc != 0:
            return None, f"NVML found no GPU {pci_bus_id or index} (error {rc})"
        return cls(lib, handle), f"NVML, GPU {pci_bus_id or f'index {index}'}"

    def _uint(self, fn: Any, *args: Any) -> int | None:
        value = ctypes.c_uint(0)
        return int(value.value) if fn(self.handle, *args, ctypes.byref(value)) == 0 else None

    def _ulonglong(self, fn: Any) -> int | None:
        value = ctypes.c_ulonglong(0)
        return int(value.value) if fn is not None and fn(self.handle, ctypes.byref(value)) == 0 else None

    def power_limit_w(self) -> float | None:
        """The power limit the driver enforces now (the lowest of the limits set on the board), in W; None where
        the driver will not say."""
        fn = getattr(self.lib, "nvmlDeviceGetEnforcedPowerLimit", None)
        limit = self._uint(fn) if fn is not None else None
        return None if limit is None else limit / 1e3

    def mem_mhz(self) -> int | None:
        """The memory clock now, in MHz (what bounds a copy through DRAM, where the SM clock does not); None where the
        driver will not say."""
        return self._uint(self.lib.nvmlDeviceGetClockInfo, ctypes.c_int(NVML_CLOCK_MEM))

    def read(self) -> Sample:
        lib = self.lib
        power = self._uint(lib.nvmlDeviceGetPowerUsage)
        energy = self._ulonglong(getattr(lib, "nvmlDeviceGetTotalEnergyConsumption", None))
        return Sample(t=time.monotonic(), sm_mhz=self._uint(lib.nvmlDeviceGetClockInfo, ctypes.c_int(NVML_CLOCK_SM)),
                      power_w=None if power is None else power / 1e3, energy_j=None if energy is None else energy / 1e3,
                      reasons=self._ulonglong(self._reasons),
                      temp_c=self._uint(lib.nvmlDeviceGetTemperature, ctypes.c_int(NVML_TEMPERATURE_GPU)))


class Sampler:
    """Reads ``nvml`` every ``period_s`` in a daemon thread while it runs (``with Sampler(...) as s``);
    :meth:`summary` describes a time window of it."""

    def __init__(self, nvml: Nvml, period_s: float = 0.02) -> None:
        self.nvml, self.period_s = nvml, period_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.nvml.read())
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        """What :func:`summarise` says of the samples taken between ``t0`` and ``t1`` (time.monotonic())."""
        return summarise(list(self.samples), t0, t1)


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def summarise(samples: list[Sample], t0: float, t1: float) -> dict[str, Any]:
    """The window ``t0``..``t1`` (seconds, time.monotonic()): SM clock (median, lowest, highest), power
    (from the energy counter over the first to the last sample inside, and the mean and median of the
    power readings), the event reasons OR-ed (hex, and in words) and the highest temperature."""
    inside = [s for s in samples if t0 <= s.t <= t1]
    clocks = [float(s.sm_mhz) for s in inside if s.sm_mhz is not None]
    powers = [s.power_w for s in inside if s.power_w is not None]
    energy = [(s.t, s.energy_j) for s in inside if s.energy_j is not None]
    reasons = [s.reasons for s in inside if s.reasons is not None]
    temps = [s.temp_c for s in inside if s.temp_c is not None]
    energy_w = None
    if len(energy) >= 2 and energy[-1][0] > energy[0][0]:
        energy_w = (energy[-1][1] - energy[0][1]) / (energy[-1][0] - energy[0][0])
    mask = None
    if reasons:
        mask = 0
        for r in reasons:
            mask |= r
    hex_mask = None if mask is None else f"0x{mask:016x}"
    return {"seconds": t1 - t0, "samples": len(inside), "sm_mhz_median": _median(clocks),
            "sm_mhz_min": min(clocks) if clocks else None, "sm_mhz_max": max(clocks) if clocks else None,
            "power_w_energy": energy_w, "power_w_mean": statistics.fmean(powers) if powers else None,
            "power_w_median": _median(powers),
            "event_reasons": hex_mask, "event_reasons_words": describe_event_reasons(hex_mask),
            "temp_c_max": max(temps) if temps else None}


def window_power_w(nv: dict[str, Any]) -> float | None:
    """A :func:`summarise` window's power: the energy counter's average over it where there is one (it covers the
    window itself), else the median of the power readings (each an average over about the last second on recent
    GPUs, so it lags a window shorter than that)."""
    return nv.get("power_w_energy") or nv.get("power_w_median")


def describe_window(nv: dict[str, Any]) -> str:
    """One line for a :func:`summarise` window (with ``power_limit_w`` where the caller added it): the median SM
    clock and its lowest, the power (from the energy counter where there is one), the limit, the reasons."""
    if not nv.get("sm_mhz_median"):
        return f"no SM clock read in the window ({nv.get('samples', 0)} readings)"
    power = window_power_w(nv)
    limit = nv.get("power_limit_w")
    return (f"SM clock {nv['sm_mhz_median']:.0f} MHz (lowest {nv['sm_mhz_min']:.0f}), "
            + (f"{power:.0f} W" if power is not None else "power not reported")
            + (f" of a {limit:.0f} W limit" if limit else "")
            + f", clock-event reasons: {nv['event_reasons_words']} ({nv['samples']} readings in {nv['seconds']:.2f} s)")


def torch_pci_bus_id(torch: Any, index: int = 0) -> str | None:
    """CUDA device ``index``'s PCI bus id as CUDA writes it (``0000:05:00.0``), from PyTorch's device properties,
    for :meth:`Nvml.open` (under CUDA_VISIBLE_DEVICES CUDA's index 0 need not be NVML's); None where this PyTorch
    does not report it."""
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


def open_sampler(pci_bus_id: str | None, period_s: float = 0.02, lib: Any = None) -> tuple[Sampler | None, float | None, str]:
    """(a started :class:`Sampler`, the enforced power limit in W, what it reads) for the GPU at ``pci_bus_id``
    (NVML index 0 if None), or (None, None, why not). The caller stops it (``sampler.__exit__``); its thread
    is a daemon, so a script that fails does not hang on it."""
    nvml, why = Nvml.open(pci_bus_id=pci_bus_id, lib=lib)
    if nvml is None:
        return None, None, why
    sampler = Sampler(nvml, period_s)
    sampler.__enter__()
    return sampler, nvml.power_limit_w(), f"{why}, read every {period_s * 1e3:.0f} ms by a thread"


def torch_sampler(torch: Any, gpu: bool, enabled: bool = True) -> tuple[Sampler | None, float | None, str]:
    """:func:`open_sampler` for PyTorch's current CUDA device, or (None, None, why none): on the CPU, when the caller's
    switch is off (``enabled``: a script's ``--no-clocks``), or where NVML cannot be opened. Scripts print the third
    item once, so that a run without clocks says why."""
    if not gpu:
        return None, None, "on the CPU: no SM clock or power to read"
    if not enabled:
        return None, None, "--no-clocks"
    return open_sampler(torch_pci_bus_id(torch, torch.cuda.current_device()))
