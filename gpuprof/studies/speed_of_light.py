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
from ..backend import Backend, choose_backend, describe_machine, host_description
from ..device_state import BANDWIDTH_HOW, describe_event_reasons, memory_bandwidth_gbps, read_clocks
from ..errors import GpuprofError
from ..timing import Timing, time_call

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

__all__ = ["Figure", "Peak", "bandwidth_bars", "measure", "matmul_bf16", "device_copy", "device_record", "save", "load",
           "saved_device", "peaks", "format_table", "format_device", "GPU_DEFAULTS", "CPU_DEFAULTS", "CHAPTER", "FILENAME",
           "DATASHEETS", "DATASHEET_BF16_DENSE_TFLOPS", "datasheet_bf16_tflops", "datasheet_of"]

CHAPTER = "ch00"
FILENAME = "speed_of_light.json"
GPU_DEFAULTS = {"copy_bytes": 1 << 30, "matmul_n": 8192, "repeats": 10, "launches": 2000}
CPU_DEFAULTS = {"copy_bytes": 64 << 20, "matmul_n": 1024, "repeats": 5, "launches": 2000}

# The specified peaks of the GPUs the course was measured on, from NVIDIA's datasheets ("NVIDIA H100 Tensor
# Core GPU" and "NVIDIA H200 Tensor Core GPU", the SXM columns): GPU memory bandwidth 3.35 TB/s (H100 SXM) and
# 4.8 TB/s (H200 SXM); FP32 67 TFLOP/s; BF16 Tensor Core 1,979 TFLOP/s, a figure the datasheets mark "with
# sparsity": dense is half, 989.4 in NVIDIA's "NVIDIA H100 Tensor Core GPU Architecture" whitepaper (H100 SXM5,
# 1,978.9 with sparsity). The dense bf16 peak is also the denominator of MFU as published figures use it.
# The H100 PCIe and NVL and the H200 NVL have other clocks and other peaks, and a GH200 another memory: they are
# deliberately absent, so that a GPU not listed here gets "unknown" rather than a wrong peak.
_BF16 = 'BF16 Tensor Core 1,979 "with sparsity", dense is half: '
DATASHEETS: dict[str, dict[str, Any]] = {
    "H100 SXM": {"document": "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM",
                 "hbm_gbps": 3350.0, "bf16_dense_tflops": 989.4, "fp32_tflops": 67.0,
                 "bf16_note": _BF16 + "989.4 in NVIDIA's H100 Tensor Core GPU Architecture whitepaper (H100 SXM5)"},
    "H200 SXM": {"document": "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM",
                 "hbm_gbps": 4800.0, "bf16_dense_tflops": 989.4, "fp32_tflops": 67.0,
                 "bf16_note": _BF16 + "989.4, the H100 SXM's (the same GH100 chip, the same 1,979 in its datasheet)"},
}
# The names the driver reported for those boards on the course's machines (``torch.cuda.get_device_name``,
# ``nvidia-smi``), matched exactly: "NVIDIA H200 NVL" and "NVIDIA GH200 480GB" contain "H200" and are other products.
_MODELS = {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H200": "H200 SXM"}
DATASHEET_BF16_DENSE_TFLOPS = {name: DATASHEETS[model]["bf16_dense_tflops"] for name, model in _MODELS.items()}


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
DUPLEX_LABEL = "H2D + D2H at once, pinned (both counted)"


def _d2d_copy(backend: Backend, src: Any, dst: Any) -> Callable[[], object]:
    """One device-to-device copy of ``src`` into ``dst``: the memory-bandwidth ceiling's method."""
    if backend.name == "torch":
        return lambda: dst.copy_(src)
    return lambda: backend.xp.copyto(dst, src)


def _copy_buffers(backend: Backend, copy_bytes: int) -> tuple[Any, Any]:
    """Two uninitialised device buffers of ``copy_bytes`` bytes: a copy's source and destination."""
    xp = backend.xp
    src = xp.empty(copy_bytes, dtype=xp.uint8, device="cuda") if backend.name == "torch" else xp.empty(copy_bytes, dtype=xp.uint8)
    return src, xp.empty_like(src)


def device_copy(backend: Backend, copy_bytes: int | None = None, repeats: int | None = None) -> Figure:
    """Only the device-to-device copy figure, measured exactly as :func:`measure` does.

    Later chapters call this to compare a kernel's bandwidth with the ceiling measured in
    the same process, on the same GPU, minutes apart rather than days.
    """
    if not backend.is_gpu:
        raise GpuprofError("A device-to-device copy needs a GPU.", "On a CPU, compare with the reference figures.")
    copy_bytes = int(copy_bytes or GPU_DEFAULTS["copy_bytes"])
    repeats = int(repeats or GPU_DEFAULTS["repeats"])
    src, dst = _copy_buffers(backend, copy_bytes)
    t = time_call(_d2d_copy(backend, src, dst), backend=backend, warmup=3, repeats=repeats)
    del src, dst
    return Figure("d2d", D2D_LABEL, _gbps(2 * copy_bytes, t), "GB/s",
                  f"{copy_bytes / 2**20:.0f} MiB, median of {repeats}, {t.method}", t.relative_spread)


def copy_series(backend: Backend, count: int, busy_s: float, sample: Callable[[], dict[str, Any]] | None = None,
                copy_bytes: int | None = None) -> list[dict[str, Any]]:
    """The device copy (:func:`device_copy`, unchanged) measured ``count`` times in this process, with ``busy_s``
    seconds of back-to-back copies of the same size between two measurements; each row has the time since the first
    measurement began, the GB/s, the measurement's own relative spread and whatever ``sample()`` read right after it
    (a dict: clocks, temperature, power, clock-event reasons; see ``scripts/capture_ch12.py``'s copy_series_target).

    Why: every share of "the copy" in the course divides by one such measurement, taken once per process. Whether
    that figure is noise around a fixed ceiling or drifts as the GPU stays busy (clocks, temperature) decides what a
    margin of a fraction of a percent over a target means; one measurement per process cannot tell the two apart."""
    if count < 1 or busy_s < 0:
        raise GpuprofError(f"copy_series needs a count of at least 1 and a busy time of at least 0 s (got {count}, {busy_s}).")
    copy_bytes = int(copy_bytes or GPU_DEFAULTS["copy_bytes"])
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for i in range(count):
        start = time.monotonic() - t0
        fig = device_copy(backend, copy_bytes)
        row: dict[str, Any] = {"t_s": round(start, 3), "gbps": fig.value, "relative_spread": fig.spread}
        if sample is not None:
            row.update(sample())
        rows.append(row)
        if i + 1 < count and busy_s > 0:
            src, dst = _copy_buffers(backend, copy_bytes)
            copy, end = _d2d_copy(backend, src, dst), time.monotonic() + busy_s
            while time.monotonic() < end:
                for _ in range(20):
                    copy()
                backend.synchronize()
            del src, dst
    return rows


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
    pinned_out = torch.empty(copy_bytes, dtype=torch.uint8, pin_memory=True)
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def duplex() -> None:
        """One H2D and one D2H copy at once, on two streams that start after, and end before, the timing events
        recorded on the current stream. Separate buffers each way, so neither copy waits for the other."""
        here = torch.cuda.current_stream()
        up.wait_stream(here)
        down.wait_stream(here)
        with torch.cuda.stream(up):
            dev.copy_(pinned, non_blocking=True)
        with torch.cuda.stream(down):
            pinned_out.copy_(dev2, non_blocking=True)
        here.wait_stream(up)
        here.wait_stream(down)

    return [
        ("h2d_pinned", "H2D copy, pinned host memory", "GB/s", lambda: dev.copy_(pinned, non_blocking=True), copy_bytes),
        ("h2d_pageable", "H2D copy, pageable host memory", "GB/s", lambda: dev.copy_(pageable), copy_bytes),
        ("d2h_pinned", "D2H copy, pinned host memory", "GB/s", lambda: pinned.copy_(dev, non_blocking=True), copy_bytes),
        ("d2h_pageable", "D2H copy, pageable host memory", "GB/s", lambda: pageable.copy_(dev), copy_bytes),
        ("duplex_pinned", DUPLEX_LABEL, "GB/s", duplex, 2 * copy_bytes),
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
        if key == "duplex_pinned":
            size_txt += " each way"
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


CLOCKS_HOW = "nvidia-smi, read while {} products ran, right after the figures were measured"


def device_record(backend: Backend | None = None, n: int | None = None) -> dict[str, Any] | None:
    """What the GPU itself says about the figures' conditions: its peak memory bandwidth and its clocks under load.

    The clocks are read by nvidia-smi while ``n``-cubed matrix products (bf16 with PyTorch, fp32 with CuPy) keep
    the GPU busy, since an idle GPU lowers its clocks at once. The record is saved with the figures
    (:func:`save`) and shown by :func:`format_device`; None on a CPU.
    """
    backend = backend or choose_backend()
    if not backend.is_gpu:
        return None
    xp, n = backend.xp, int(n or GPU_DEFAULTS["matmul_n"])
    gpu = None
    if backend.name == "torch":
        a = xp.randn(n, n, device="cuda", dtype=xp.bfloat16)
        uuid = str(getattr(xp.cuda.get_device_properties(0), "uuid", "") or "")
        gpu = (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None
        kind = f"bf16 {n}^3"
    else:
        a = xp.random.standard_normal((n, n), dtype=xp.float32)
        kind = f"fp32 {n}^3"
    busy = lambda: a @ a  # noqa: E731
    for _ in range(50):  # the GPU is at work before the first question
        busy()
    clocks = read_clocks(busy, gpu=gpu)
    if gpu and clocks and not any(clocks.values()):  # nvidia-smi did not take this -i: ask for the first GPU
        clocks = read_clocks(busy)
    backend.synchronize()
    del a
    clocks = clocks if clocks and any(clocks.values()) else None  # nvidia-smi answered nothing: no record
    bandwidth = memory_bandwidth_gbps(backend)
    return {"memory_bandwidth_gbps": bandwidth, "memory_bandwidth_how": BANDWIDTH_HOW if bandwidth else None,
            "clocks": clocks, "clocks_how": CLOCKS_HOW.format(kind) if clocks else None}


def save(figures: list[Figure], *, command: str, device: dict[str, Any] | None = None, overwrite: bool = True) -> None:
    """Save GPU figures for the later chapters, with :func:`device_record`'s record; refuses CPU figures,
    which are not GPU ceilings."""
    machine = describe_machine()
    if machine.device != "cuda":
        raise GpuprofError("Refusing to save CPU figures as this machine's GPU speed of light.",
                           "They are shown, not saved; run chapter 0 on a GPU to save figures.")
    data: dict[str, Any] = {"figures": [asdict(f) for f in figures]}
    if device is not None:
        data["device"] = device
    save_json(CHAPTER, FILENAME, data, command=command, overwrite=overwrite)


def load(prefer: str = "this machine") -> tuple[list[Figure], FoundCapture]:
    """The saved figures (this machine's, else the course's reference) and where they came from."""
    found = find_capture(CHAPTER, FILENAME, prefer=prefer)
    data = found.json()
    return [Figure.from_dict(f) for f in data["figures"]], found


def saved_device(found: FoundCapture) -> dict[str, Any]:
    """The :func:`device_record` saved with the figures; empty for a file saved before chapter 0 kept one."""
    return found.json().get("device") or {}


def format_device(found: FoundCapture) -> str:
    """The host, the GPU's clocks under load and its own peak memory bandwidth, as the figures' file records them.

    The host matters because a launch is CPU work (Python, the framework, the CUDA runtime and driver), so
    the launch figure says as much about the CPU as about the GPU.
    """
    device = saved_device(found)
    lines = [f"host: {host_description(found.machine)}"]
    clocks = device.get("clocks")
    if not clocks:
        lines.append("GPU clocks: not recorded with these figures")
    else:
        def mhz(now: str | None, top: str | None) -> str:
            return f"{now or '?'} MHz (maximum {top or '?'} MHz)"

        lines.append(f"GPU clocks under load ({device.get('clocks_how')}): SM {mhz(clocks.get('sm_mhz'), clocks.get('max_sm_mhz'))}, "
                     f"memory {mhz(clocks.get('memory_mhz'), clocks.get('max_memory_mhz'))}")
        lines.append(f"  persistence mode {clocks.get('persistence_mode') or 'not reported'}; "
                     f"clock event reasons active: {describe_event_reasons(clocks.get('event_reasons'))}")
    bandwidth = device.get("memory_bandwidth_gbps")
    if bandwidth:
        lines.append(f"GPU memory's peak as the GPU reports it: {bandwidth:,.0f} GB/s ({device.get('memory_bandwidth_how')})")
    return "\n".join(lines)


# Per-lane signalling rate (GT/s) and line-code efficiency, by PCIe generation, from the
# PCI-SIG base specifications: 8b/10b encoding up to gen 2, 128b/130b for gens 3 to 5.
_PCIE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130)}


def datasheet_of(gpu_name: str | None) -> tuple[str, dict[str, Any]] | None:
    """(the model, its :data:`DATASHEETS` entry) for a GPU by the exact name its driver reports, or None."""
    model = _MODELS.get((gpu_name or "").strip())
    return (model, DATASHEETS[model]) if model else None


def datasheet_bf16_tflops(gpu_name: str | None) -> float | None:
    """The specified dense bf16 peak of a GPU by its reported name, or None for a GPU not in the table
    (H100 PCIe and NVL, H200 NVL and GH200 have other clocks or memories: they are deliberately absent)."""
    found = datasheet_of(gpu_name)
    return found[1]["bf16_dense_tflops"] if found else None


def pcie_theoretical_gbps(gen: int | None, width: int | None) -> float | None:
    """One direction's raw data rate of a PCIe link in GB/s, before packet overheads.

    Gen 5 x16: 32 GT/s x 16 lanes x 128/130 / 8 bits = 63.0 GB/s. Real copies reach
    less, because every transfer also carries packet headers and flow control.
    """
    if gen not in _PCIE or not width:
        return None
    rate, code = _PCIE[gen]
    return rate * width * code / 8


@dataclass(frozen=True)
class Peak:
    """A specified ceiling to set a measured figure against, and where it comes from (None: unknown here)."""

    value: float | None
    unit: str
    source: str


_LINK_KEYS = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")


def peaks(found: FoundCapture) -> dict[str, Peak]:
    """The specified peak for each figure in ``found``'s file that has one: the PCIe link's raw rate for the
    host-device copies (twice it for both directions at once), the GPU's memory bandwidth for the device copy
    (as the GPU reports it when the file records that, else the datasheet), the datasheet's dense bf16 and FP32
    rates for the matrix products. A GPU missing from :data:`DATASHEETS` gets peaks of value None ("unknown").
    """
    machine = found.machine
    gen, width = machine.get("pcie_gen"), machine.get("pcie_width")
    link = pcie_theoretical_gbps(gen, width)
    out: dict[str, Peak] = {}
    if link:
        spec = f"PCIe gen{gen} x{width} raw rate, one direction (PCI-SIG base specification: lanes x GT/s x line code / 8)"
        out.update({k: Peak(link, "GB/s", spec) for k in _LINK_KEYS})
        out["duplex_pinned"] = Peak(2 * link, "GB/s", f"the same link in both directions at once (2 x {link:.1f} GB/s)")
    else:
        unknown = Peak(None, "GB/s", "unknown: the PCIe link was not recorded")
        out.update({k: unknown for k in (*_LINK_KEYS, "duplex_pinned")})
    name = machine.get("gpu_name")
    sheet = datasheet_of(name)
    recorded = saved_device(found).get("memory_bandwidth_gbps")
    if recorded:
        out["d2d"] = Peak(recorded, "GB/s", f"the GPU's own record ({BANDWIDTH_HOW})")
    elif sheet:
        out["d2d"] = Peak(sheet[1]["hbm_gbps"], "GB/s", f"{sheet[1]['document']}: GPU memory bandwidth")
    else:
        out["d2d"] = Peak(None, "GB/s", f"unknown: no datasheet for {name or 'this GPU'} in gpuprof's table")
    if sheet:
        out["matmul_bf16"] = Peak(sheet[1]["bf16_dense_tflops"], "TFLOP/s",
                                  f"{sheet[1]['document']}: {sheet[1]['bf16_note']}")
        out["matmul_fp32"] = Peak(sheet[1]["fp32_tflops"], "TFLOP/s", f"{sheet[1]['document']}: FP32")
    else:
        unknown_gpu = f"unknown: no datasheet for {name or 'this GPU'} in gpuprof's table"
        out["matmul_bf16"] = out["matmul_fp32"] = Peak(None, "TFLOP/s", unknown_gpu)
    return out


def format_table(figures: list[Figure], peak: dict[str, Peak] | None = None) -> str:
    """The figures as fixed-width text: identical wherever the same file is read.

    With ``peak`` (see :func:`peaks`), a column gives each figure as a share of its specified peak, marked
    with a number that the lines under the table explain (the peak and its source); "unknown" where the
    GPU's peak is not known here, "-" where a figure has no peak (the launch cost).
    """
    if peak is None:
        lines = [f"{'figure':<46}{'value':>12}  {'unit':<8}{'spread':>7}  how"]
        for f in figures:
            lines.append(f"{f.label:<46}{f.value:>12,.2f}  {f.unit:<8}{f.spread:>6.1%}  {f.how}")
        return "\n".join(lines)
    notes: list[Peak] = []
    lines = [f"{'figure':<46}{'value':>12}  {'unit':<8}{'spread':>7}  {'of peak':>11}  how"]
    for f in figures:
        p = peak.get(f.key)
        if p is None:
            share = "-"
        else:
            if p not in notes:
                notes.append(p)
            mark = f"[{notes.index(p) + 1}]"
            share = f"{f.value / p.value:.0%} {mark}" if p.value else f"unknown {mark}"
        lines.append(f"{f.label:<46}{f.value:>12,.2f}  {f.unit:<8}{f.spread:>6.1%}  {share:>11}  {f.how}")
    lines.append("peaks:")
    for i, p in enumerate(notes, 1):
        value = f"{p.value:,.1f} {p.unit}, " if p.value else ""
        lines.append(f"  [{i}] {value}{p.source}")
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
