"""Honest timers: warm-up, synchronisation, device events, repeats, median and spread.

Three mistakes make most published GPU timings wrong, and this module exists so
that no chapter makes them:

1. Reading a host clock around an asynchronous launch measures the launch (a few
   microseconds), not the work. On a GPU we time with CUDA events recorded on the
   stream, and synchronise before reading them.
2. Timing the first call measures module loading, JIT compilation, cuBLAS handle
   creation and the caching allocator's first ``cudaMalloc``. We warm up first.
3. One sample hides the noise. We repeat, report the median, and keep the spread
   (interquartile range and min/max) so a reader can tell a real difference from
   jitter.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from .backend import Backend, choose_backend
from .errors import GpuprofError

__all__ = ["Timing", "time_call", "format_seconds", "Clock"]


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one call, in seconds."""

    samples: tuple[float, ...]
    method: str  # "cuda-events" or "perf_counter"
    warmup: int

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def minimum(self) -> float:
        return min(self.samples)

    @property
    def maximum(self) -> float:
        return max(self.samples)

    @property
    def iqr(self) -> tuple[float, float]:
        """First and third quartiles (inclusive method; equals min/max for n < 4)."""
        if len(self.samples) < 2:
            return (self.samples[0], self.samples[0])
        q = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (q[0], q[2])

    @property
    def relative_spread(self) -> float:
        """(Q3 - Q1) / median: above ~0.1 the run was noisy; say so before comparing."""
        lo, hi = self.iqr
        return (hi - lo) / self.median if self.median > 0 else 0.0

    def __str__(self) -> str:
        lo, hi = self.iqr
        return (
            f"median {format_seconds(self.median)} (IQR {format_seconds(lo)}-{format_seconds(hi)}, "
            f"n={len(self.samples)}, {self.method})"
        )


def format_seconds(seconds: float) -> str:
    """Pick the unit a person would: 850 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _event_pair(backend: Backend) -> tuple[object, object]:
    if backend.name == "torch":
        ev = backend.xp.cuda.Event
        return ev(enable_timing=True), ev(enable_timing=True)
    ev = backend.xp.cuda.Event
    return ev(), ev()


def _event_seconds(backend: Backend, start: object, end: object) -> float:
    if backend.name == "torch":
        return start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
    return backend.xp.cuda.get_elapsed_time(start, end) / 1e3


def time_call(
    fn: Callable[[], object],
    *,
    backend: Backend | None = None,
    warmup: int = 3,
    repeats: int = 10,
    inner: int = 1,
) -> Timing:
    """Time ``fn()`` after ``warmup`` untimed calls; one sample per ``inner`` calls.

    On a GPU backend each sample is bracketed by CUDA events on the current stream
    and the device is synchronised before the events are read; on the CPU it is
    ``time.perf_counter``. With ``inner > 1`` a sample covers ``inner`` back-to-back
    calls and is divided by ``inner``: use it for calls too short to time alone
    (a single tiny kernel), where one event pair would be mostly overhead.
    """
    if repeats < 1 or warmup < 0 or inner < 1:
        raise GpuprofError(
            f"time_call needs repeats >= 1, warmup >= 0 and inner >= 1 (got {repeats}, {warmup}, {inner})."
        )
    backend = backend or choose_backend()
    for _ in range(warmup):
        fn()
    backend.synchronize()
    samples: list[float] = []
    if backend.is_gpu:
        for _ in range(repeats):
            start, end = _event_pair(backend)
            start.record()  # type: ignore[attr-defined]
            for _ in range(inner):
                fn()
            end.record()  # type: ignore[attr-defined]
            end.synchronize()  # type: ignore[attr-defined]
            samples.append(_event_seconds(backend, start, end) / inner)
        method = "cuda-events"
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
        method = "perf_counter"
    return Timing(tuple(samples), method, warmup)


class Clock:
    """Marks between a run's phases: CUDA events on a GPU (read after the run's synchronisation), host time on a CPU.

    :func:`time_call` times one call repeated; a training step's forward/backward/optimizer, or a generation's
    prefill and each decoding step, are different phases of one run, timed where they happen. Recording an
    event costs no synchronisation, so marking every phase does not stall the GPU the way reading
    ``time.perf_counter`` after a ``torch.cuda.synchronize()`` would.
    """

    def __init__(self, torch: Any, gpu: bool) -> None:
        self.torch, self.gpu = torch, gpu
        self.marks: list[Any] = []

    @property
    def method(self) -> str:
        return "cuda-events" if self.gpu else "perf_counter"

    def mark(self) -> None:
        if self.gpu:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (call after synchronising); clears the marks."""
        m = self.marks
        if self.gpu:
            out = [a.elapsed_time(b) for a, b in zip(m, m[1:])]
        else:
            out = [(b - a) * 1e3 for a, b in zip(m, m[1:])]
        self.marks = []
        return out
