"""This machine's ceilings: copy bandwidths, matrix-multiply rates and launch overhead.

Every later chapter judges a capture against these numbers ("the weight copies ran
at 93% of the pinned H2D peak measured on this GPU"), so they are measured once, in
chapter 0, on the reader's own GPU, and saved with their provenance. A CPU-only run
measures the host's equivalents (memcpy, NumPy matmul, tiny-op overhead) so the
reader sees the method work, but those are never saved as GPU figures.

Units: bandwidths in GB/s (1 GB = 10**9 bytes, as vendors quote them); the device
copy counts bytes read plus bytes written; matmul rates are 2*n**3 flops per product.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..artifacts import FoundCapture, find_capture, save_json
from ..backend import Backend, choose_backend, describe_machine
from ..errors import GpuprofError
from ..timing import Timing, time_call

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

__all__ = ["Figure", "bandwidth_bars", "measure", "matmul_bf16", "device_copy", "save", "load", "GPU_DEFAULTS", "CPU_DEFAULTS", "CHAPTER", "FILENAME",
           "DATASHEET_BF16_DENSE_TFLOPS", "datasheet_bf16_tflops"]

CHAPTER = "ch00"
FILENAME = "speed_of_light.json"
GPU_DEFAULTS = {"copy_bytes": 1 << 30, "matmul_n": 8192, "repeats": 10, "launches": 2000}
CPU_DEFAULTS = {"copy_bytes": 64 << 20, "matmul_n": 1024, "repeats": 5, "launches": 2000}

# Specified dense bf16 tensor-core peaks (TFLOP/s), the denominator of MFU as published figures use it.
# NVIDIA's H100 (SXM5) and H200 (SXM) datasheets give 1,979 TFLOP/s "with sparsity"; dense is half.
# Matched by substring of the name the driver reports, most specific first.
DATASHEET_BF16_DENSE_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 SXM": 989.4, "H200": 989.4}


@dataclass(frozen=True)
class Figure:
    """One measured ceiling."""

    key: str
    label: str
    value: float
    unit: str
    how: str
    spread: float  # relative interquartile range of the samples

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Figure":
        return cls(**{k: d[k] for k in ("key", "label", "value", "unit", "how", "spread")})


def _gbps(nbytes: float, t: Timing) -> float:
    return nbytes / t.median / 1e9


def _tflops(n: int, t: Timing) -> float:
    return 2 * n**3 / t.median / 1e12


def _launch_cost(launch: Callable[[], object], backend: Backend, launches: int, repeats: int) -> Timing:
    """Host time per launch of a tiny op, amortising one final synchronisation.

    This is what the CPU pays per eager op when the GPU work is shorter than the
    launch itself: the regime of many small kernels.
    """
    for _ in range(launches // 10):
        launch()
    backend.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(launches):
            launch()
        backend.synchronize()
        samples.append((time.perf_counter() - t0) / launches)
    return Timing(tuple(samples), "perf_counter + synchronize", launches // 10)


D2D_LABEL = "Device-to-device copy (read + write)"


def _d2d_copy(backend: Backend, src: Any, dst: Any) -> Callable[[], object]:
    """One device-to-device copy of ``src`` into ``dst``: the memory-bandwidth ceiling's method."""
    if backend.name == "torch":
        return lambda: dst.copy_(src)
    return lambda: backend.xp.copyto(dst, src)


def device_copy(backend: Backend, copy_bytes: int | None = None, repeats: int | None = None) -> Figure:
    """Only the device-to-device copy figure, measured exactly as :func:`measure` does.

    Later chapters call this to compare a kernel's bandwidth with the ceiling measured in
    the same process, on the same GPU, minutes apart rather than days.
    """
    if not backend.is_gpu:
        raise GpuprofError("A device-to-device copy needs a GPU.", "On a CPU, compare with the reference figures.")
    copy_bytes = int(copy_bytes or GPU_DEFAULTS["copy_bytes"])
    repeats = int(repeats or GPU_DEFAULTS["repeats"])
    xp = backend.xp
    if backend.name == "torch":
        src = xp.empty(copy_bytes, dtype=xp.uint8, device="cuda")
    else:
        src = xp.empty(copy_bytes, dtype=xp.uint8)
    dst = xp.empty_like(src)
    t = time_call(_d2d_copy(backend, src, dst), backend=backend, warmup=3, repeats=repeats)
    del src, dst
    return Figure("d2d", D2D_LABEL, _gbps(2 * copy_bytes, t), "GB/s",
                  f"{copy_bytes / 2**20:.0f} MiB, median of {repeats}, {t.method}", t.relative_spread)


def _torch_plan(backend: Backend, copy_bytes: int, n: int) -> list[tuple[str, str, str, Callable[[], object], float]]:
    torch = backend.xp
    pinned = torch.ones(copy_bytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.ones(copy_bytes, dtype=torch.uint8)
    dev = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty_like(dev)
    a16 = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a32, b32 = a16.float(), b16.float()
    torch.backends.cuda.matmul.allow_tf32 = False  # plain fp32: say what we measure
    return [
        ("h2d_pinned", "H2D copy, pinned host memory", "GB/s", lambda: dev.copy_(pinned, non_blocking=True), copy_bytes),
        ("h2d_pageable", "H2D copy, pageable host memory", "GB/s", lambda: dev.copy_(pageable), copy_bytes),
        ("d2h_pinned", "D2H copy, pinned host memory", "GB/s", lambda: pinned.copy_(dev, non_blocking=True), copy_bytes),
        ("d2h_pageable", "D2H copy, pageable host memory", "GB/s", lambda: pageable.copy_(dev), copy_bytes),
        ("d2d", D2D_LABEL, "GB/s", _d2d_copy(backend, dev, dev2), 2 * copy_bytes),
        ("matmul_bf16", f"bf16 matmul {n}^3", "TFLOP/s", lambda: a16 @ b16, n),
        ("matmul_fp32", f"fp32 matmul {n}^3 (TF32 off)", "TFLOP/s", lambda: a32 @ b32, n),
    ]


def _cupy_plan(backend: Backend, copy_bytes: int, n: int) -> list[tuple[str, str, str, Callable[[], object], float]]:
    import cupyx  # ships with CuPy

    cp = backend.xp
    rt = cp.cuda.runtime
    pinned = cupyx.empty_pinned((copy_bytes,), dtype="uint8")
    pinned.fill(1)
    import numpy as np

    pageable = np.ones(copy_bytes, dtype=np.uint8)
    dev = cp.empty(copy_bytes, dtype=cp.uint8)
    dev2 = cp.empty_like(dev)
    a32 = cp.random.standard_normal((n, n), dtype=cp.float32)
    b32 = cp.random.standard_normal((n, n), dtype=cp.float32)

    def h2d(src: Any) -> Callable[[], object]:
        return lambda: rt.memcpy(dev.data.ptr, src.ctypes.data, copy_bytes, rt.memcpyHostToDevice)

    def d2h(dst: Any) -> Callable[[], object]:
        return lambda: rt.memcpy(dst.ctypes.data, dev.data.ptr, copy_bytes, rt.memcpyDeviceToHost)

    return [
        ("h2d_pinned", "H2D copy, pinned host memory", "GB/s", h2d(pinned), copy_bytes),
        ("h2d_pageable", "H2D copy, pageable host memory", "GB/s", h2d(pageable), copy_bytes),
        ("d2h_pinned", "D2H copy, pinned host memory", "GB/s", d2h(pinned), copy_bytes),
        ("d2h_pageable", "D2H copy, pageable host memory", "GB/s", d2h(pageable), copy_bytes),
        ("d2d", D2D_LABEL, "GB/s", _d2d_copy(backend, dev, dev2), 2 * copy_bytes),
        ("matmul_fp32", f"fp32 matmul {n}^3 (CuPy, no bf16)", "TFLOP/s", lambda: a32 @ b32, n),
    ]


def _cpu_plan(copy_bytes: int, n: int) -> list[tuple[str, str, str, Callable[[], object], float]]:
    import numpy as np

    rng = np.random.default_rng(0)
    src = np.ones(copy_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return [
        ("host_memcpy", "Host memory copy (read + write, NumPy)", "GB/s", lambda: np.copyto(dst, src), 2 * copy_bytes),
        ("matmul_fp32", f"fp32 matmul {n}^3 (NumPy BLAS)", "TFLOP/s", lambda: a @ b, n),
    ]


def measure(backend: Backend | None = None, *, copy_bytes: int | None = None, matmul_n: int | None = None,
            repeats: int | None = None, launches: int | None = None,
            progress: Callable[[str], None] | None = print) -> list[Figure]:
    """Measure this machine's ceilings with ``backend`` (default: the best available).

    Sizes default to :data:`GPU_DEFAULTS` on a GPU (1 GiB copies, 8192^3 products:
    large enough to leave launch and cache effects far behind) and to the small
    :data:`CPU_DEFAULTS` elsewhere, so a CPU-only run takes seconds.
    """
    backend = backend or choose_backend()
    d = GPU_DEFAULTS if backend.is_gpu else CPU_DEFAULTS
    copy_bytes = int(copy_bytes or d["copy_bytes"])
    n = int(matmul_n or d["matmul_n"])
    repeats = int(repeats or d["repeats"])
    launches = int(launches or d["launches"])
    if copy_bytes <= 0 or n <= 0 or repeats <= 0 or launches <= 0:
        raise GpuprofError("Sizes, repeats and launches must be positive.",
                           f"Got copy_bytes={copy_bytes}, matmul_n={n}, repeats={repeats}, launches={launches}.")
    if backend.is_gpu and backend.name == "torch":
        plan = _torch_plan(backend, copy_bytes, n)
        tiny = backend.xp.zeros(1, device="cuda")
        launch = lambda: tiny.add_(1.0)  # noqa: E731
        launch_label = "Eager launch of a tiny PyTorch kernel"
    elif backend.is_gpu:
        plan = _cupy_plan(backend, copy_bytes, n)
        tiny = backend.xp.zeros(1, dtype=backend.xp.float32)
        launch = lambda: tiny.__iadd__(1.0)  # noqa: E731
        launch_label = "Launch of a tiny CuPy kernel"
    else:
        plan = _cpu_plan(copy_bytes, n)
        import numpy as np

        tiny = np.zeros(1, dtype=np.float32)
        launch = lambda: np.add(tiny, 1.0, out=tiny)  # noqa: E731
        launch_label = "Tiny NumPy op (no GPU: interpreter overhead only)"
    figures: list[Figure] = []
    for key, label, unit, fn, size in plan:
        t = time_call(fn, backend=backend, warmup=3, repeats=repeats)
        value = _tflops(int(size), t) if unit == "TFLOP/s" else _gbps(size, t)
        size_txt = f"{copy_bytes / 2**20:.0f} MiB" if unit == "GB/s" else f"n={n}"
        figures.append(Figure(key, label, value, unit, f"{size_txt}, median of {repeats}, {t.method}", t.relative_spread))
        if progress:
            progress(f"  {label:<44} {value:10.1f} {unit}")
    t = _launch_cost(launch, backend, launches, repeats)
    figures.append(Figure("launch", launch_label, t.median * 1e6, "us",
                          f"{launches} launches per sample, median of {repeats}, {t.method}", t.relative_spread))
    if progress:
        progress(f"  {launch_label:<44} {t.median * 1e6:10.2f} us each")
    return figures


def matmul_bf16(n: int | None = None, repeats: int | None = None) -> Figure | None:
    """Chapter 0's bf16 matrix-product rate alone (seconds, not the whole table), for a chapter that judges
    its model FLOPs against it in the same run; None without a PyTorch GPU (no bf16 rate to measure)."""
    backend = choose_backend()
    if not (backend.is_gpu and backend.name == "torch"):
        return None
    torch = backend.xp
    n = int(n or GPU_DEFAULTS["matmul_n"])
    repeats = int(repeats or GPU_DEFAULTS["repeats"])
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = time_call(lambda: a @ b, backend=backend, warmup=3, repeats=repeats)
    del a, b
    return Figure("matmul_bf16", f"bf16 matmul {n}^3", _tflops(n, t), "TFLOP/s", f"n={n}, median of {repeats}, {t.method}",
                  t.relative_spread)


def save(figures: list[Figure], *, command: str, overwrite: bool = True) -> None:
    """Save GPU figures for the later chapters; refuses CPU figures, which are not GPU ceilings."""
    machine = describe_machine()
    if machine.device != "cuda":
        raise GpuprofError("Refusing to save CPU figures as this machine's GPU speed of light.",
                           "They are shown, not saved; run chapter 0 on a GPU to save figures.")
    save_json(CHAPTER, FILENAME, {"figures": [asdict(f) for f in figures]}, command=command, overwrite=overwrite)


def load(prefer: str = "this machine") -> tuple[list[Figure], FoundCapture]:
    """The saved figures (this machine's, else the course's reference) and where they came from."""
    found = find_capture(CHAPTER, FILENAME, prefer=prefer)
    data = found.json()
    return [Figure.from_dict(f) for f in data["figures"]], found


# Per-lane signalling rate (GT/s) and line-code efficiency, by PCIe generation, from the
# PCI-SIG base specifications: 8b/10b encoding up to gen 2, 128b/130b for gens 3 to 5.
_PCIE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130)}


def datasheet_bf16_tflops(gpu_name: str | None) -> float | None:
    """The specified dense bf16 peak of a GPU by its reported name, or None for a GPU not in the table
    (H100 PCIe and NVL have lower clocks and other peaks: they are deliberately absent)."""
    for key, value in DATASHEET_BF16_DENSE_TFLOPS.items():
        if gpu_name and key in gpu_name:
            return value
    return None


def pcie_theoretical_gbps(gen: int | None, width: int | None) -> float | None:
    """One direction's raw data rate of a PCIe link in GB/s, before packet overheads.

    Gen 5 x16: 32 GT/s x 16 lanes x 128/130 / 8 bits = 63.0 GB/s. Real copies reach
    less, because every transfer also carries packet headers and flow control.
    """
    if gen not in _PCIE or not width:
        return None
    rate, code = _PCIE[gen]
    return rate * width * code / 8


def format_table(figures: list[Figure]) -> str:
    """The figures as fixed-width text: identical wherever the same file is read."""
    lines = [f"{'figure':<46}{'value':>12}  {'unit':<8}{'spread':>7}  how"]
    for f in figures:
        lines.append(f"{f.label:<46}{f.value:>12,.2f}  {f.unit:<8}{f.spread:>6.1%}  {f.how}")
    return "\n".join(lines)


def by_key(figures: list[Figure]) -> dict[str, Figure]:
    return {f.key: f for f in figures}


def bandwidth_bars(figures: Sequence[Figure], title: str) -> "MplFigure":
    """Horizontal bars of every GB/s figure, on a log axis, each labelled with its value.

    A log axis because the figures span two orders of magnitude (pageable PCIe copies
    at tens of GB/s, HBM at thousands), and the point of the picture is the ratio.
    """
    import matplotlib.pyplot as plt  # here, not at the top: importing this module stays cheap

    rows = [f for f in figures if f.unit == "GB/s"]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(rows) + 1.2))
    if not rows:
        ax.text(0.5, 0.5, "no bandwidth figures", ha="center", va="center")
        ax.set_axis_off()
        return fig
    labels = [f.label for f in rows]
    values = [f.value for f in rows]
    colors = ["#4c72b0" if "H2D" in f.label or "D2H" in f.label else "#55a868" for f in rows]
    ax.barh(labels, values, color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (10^9 bytes per second, log scale)")
    ax.set_title(title, fontsize=10)
    for y, v in enumerate(values):
        ax.text(v * 1.05, y, f"{v:,.0f}", va="center", fontsize=8)
    ax.set_xlim(min(values) / 2, max(values) * 3)
    fig.tight_layout()
    return fig
