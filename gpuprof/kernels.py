"""Compile, launch and time the course's hand-written CUDA kernels (``examples/nsight_compute``).

The kernels live in ``.cu`` files beside their scripts, so that a reader can read them
whole and the book can include them. They are compiled when a script starts (nvcc when
it is installed, else CuPy's NVRTC) with ``-lineinfo``, so that Nsight Compute's Source
Counters map every SASS instruction back to a line of the ``.cu`` file, and loaded with
CuPy. Kernels are ``extern "C"``: ncu and nsys
show them under the plain names the files give them (``-k regex:transpose_naive``).

Every script runs everywhere: on a machine where CuPy cannot use a GPU, the script
says so and lets NumPy compute the same result (there is then nothing to profile).
:class:`Variant` and :func:`bench` time each kernel the same way (warm-up launches,
then CUDA events around each repeat, median and spread) and wrap its launches in an
NVTX range named after it (a push/pop range: ``ncu --nvtx --nvtx-include NAME/`` selects
it) inside a start/end range ``timed`` (``--nvtx-include timed`` selects the timed launches of
every kernel, and none of the set-up, fills and checks around them).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from .backend import Backend, describe_machine
from .errors import GpuprofError
from .ranges import annotate, process_range
from .timing import time_call

__all__ = ["cupy_gpu", "compile_kernels", "Variant", "Result", "bench", "format_results", "write_json",
           "NVRTC_OPTIONS", "add_bench_arguments", "sample_rows", "ptxas_usage", "parse_ptxas_verbose",
           "kernel_attributes", "find_nvcc", "build_cuda_example"]

NVRTC_OPTIONS = ("-lineinfo", "-std=c++17")


def cupy_gpu() -> ModuleType | None:
    """CuPy, if it can use a CUDA GPU here (the hand-written kernels need it); else None."""
    if os.environ.get("GPUPROF_BACKEND", "").strip().lower() == "cpu":
        return None
    try:
        import cupy as cp

        if cp.cuda.is_available():
            cp.cuda.runtime.getDeviceCount()
            return cp
    except Exception:  # not installed, no driver, no device
        return None
    return None


# What --cpu does in a script with a NumPy stand-in (a small CPU version of its computation, checked, nothing to
# profile). A script without one passes its own ``cpu_help``: the help must not promise what the script lacks.
CPU_STAND_IN_HELP = ("run the NumPy stand-in even where a GPU is available (a CPU version of the computation, checked; "
                     "nothing for ncu to profile)")


def add_bench_arguments(parser: argparse.ArgumentParser, *, cpu_help: str = CPU_STAND_IN_HELP) -> None:
    """The options every kernel script shares: warm-up, repeats, where to write results, CPU-only.

    ``cpu_help`` is what ``--cpu`` does in this script; the default promises a NumPy stand-in, so a
    script without one (its kernels have no CPU version) must say what it does instead."""
    from .cli import nonnegative_int, output_file, positive_int

    parser.add_argument("--warmup", type=nonnegative_int, default=2, help="untimed launches of each kernel first (default: 2)")
    parser.add_argument("--repeats", type=positive_int, default=10,
                        help="timed launches of each kernel; the median is reported (default: 10; use 1 under ncu)")
    parser.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    parser.add_argument("--cpu", action="store_true", help=cpu_help)


def choose_kernels(parser: argparse.ArgumentParser, text: str, choices: Sequence[str]) -> list[str]:
    """The kernels named by a ``--kernels`` value ("all" or a comma-separated subset), in the order given.

    An unknown or empty choice ends the script through ``parser.error`` with the valid names, not a traceback.
    """
    chosen = list(choices) if text == "all" else [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in choices]
    if unknown or not chosen:
        parser.error(f"unknown kernel(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(choices)}")
    return chosen


def bf16_bits(x_f32, xp):  # type: ignore[no-untyped-def]
    """Round float32 to bfloat16 (to nearest, ties to even) and return the 16-bit patterns.

    NumPy and CuPy have no bfloat16 type; a bfloat16 is the top half of a float32, so the
    patterns can be handed to a kernel that takes ``__nv_bfloat16*``.
    """
    u = x_f32.view(xp.uint32)
    rounded = u + xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1))
    return (rounded >> xp.uint32(16)).astype(xp.uint16)


def bf16_to_f32(bits, xp):  # type: ignore[no-untyped-def]
    """The float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's top half)."""
    return (bits.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def sample_rows(n: int, count: int = 8, seed: int = 0) -> list[int]:
    """A few row indices spread over ``n`` (always the first and the last), for spot checks against NumPy."""
    import random

    rng = random.Random(seed)
    picks = {0, n - 1, *(rng.randrange(n) for _ in range(max(0, count - 2)))}
    return sorted(picks)


def find_nvcc() -> str | None:
    """The nvcc to use: ``$NVCC``, else the one on ``PATH``, else CUDA's default install; None when there is none."""
    import shutil

    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def compile_kernels(cu_file: str | Path, names: Sequence[str], cp: ModuleType, *, arch: str | None = None,
                    max_dynamic_shared: dict[str, int] | None = None) -> dict[str, Any]:
    """Compile ``cu_file`` with ``-lineinfo`` for this GPU and return its kernels by name.

    ``arch`` overrides the target (default ``sm_XY`` of this GPU): ``"sm_90a"`` builds the
    Hopper-only instructions (wgmma, setmaxnreg), which plain ``sm_90`` rejects; it is
    passed as ``-gencode=arch=compute_90a,code=sm_90a``, the form that nvcc 13.0 assembles.
    ``max_dynamic_shared`` raises, per kernel, the dynamic shared memory a launch may ask
    for (a block gets more than 48 KiB only after that).

    With ``nvcc`` (the CUDA toolkit that ships ncu has it) the file is compiled where it
    lies, so the line table names the real ``.cu`` file and ``ncu --import-source yes``
    can embed it in the report. Without nvcc, CuPy's NVRTC compiles the same text (line
    numbers still match the file; ncu then cannot find the source by itself). A
    compile error is reported with the compiler's own message, which names the line.
    """
    cu_file = Path(cu_file).resolve()
    requested = arch
    arch = arch or f"sm_{cp.cuda.Device().compute_capability}"  # CuPy gives e.g. "90"
    target = [f"-gencode=arch=compute_{arch[3:]},code={arch}"] if arch.endswith("a") else [f"-arch={arch}"]
    nvcc = find_nvcc()
    if nvcc:
        import subprocess
        import tempfile

        out = Path(tempfile.mkdtemp(prefix="gpuprof-cubin-")) / (cu_file.stem + ".cubin")
        proc = subprocess.run([nvcc, "-cubin", *target, "-lineinfo", "-std=c++17", "-o", str(out), str(cu_file)],
                              capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            first = next((line for line in proc.stderr.splitlines() if "error" in line), proc.stderr.strip()[-300:])
            raise GpuprofError(f"{cu_file.name} did not compile: {first.strip()[:300]}",
                               "If you edited the file, the line number in the message points at the mistake.")
        module = cp.RawModule(path=str(out))
    else:
        include = Path(cp.cuda.get_cuda_path() or "/usr/local/cuda") / "include"
        try:
            module = cp.RawModule(code=cu_file.read_text(), options=(*NVRTC_OPTIONS, f"-I{include}",
                                                                       *([f"-arch={arch}"] if requested else [])))
            module.get_function(names[0])  # compiles now, so that errors surface here
        except cp.cuda.compiler.CompileException as exc:
            lines = [line for line in str(exc).splitlines() if "error" in line] or str(exc).strip().splitlines()[-1:]
            raise GpuprofError(f"{cu_file.name} did not compile (NVRTC): {lines[0].strip()[:300]}",
                               "If you edited the file, the line number in the message points at the mistake.") from None
    kernels = {name: module.get_function(name) for name in names}
    for name, nbytes in (max_dynamic_shared or {}).items():
        if name in kernels and nbytes > 48 * 1024:
            kernels[name].max_dynamic_shared_size_bytes = nbytes
    return kernels


def parse_ptxas_verbose(text: str) -> dict[str, dict[str, int]]:
    """Per kernel, what ``nvcc -Xptxas -v`` printed: registers, stack frame and spill bytes.

    ptxas names a kernel in "Compiling entry function 'NAME'" or "Function properties for
    NAME", then gives "N bytes stack frame, N bytes spill stores, N bytes spill loads" and
    "Used N registers". Kernels ptxas did not describe are absent.
    """
    import re

    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"(?:Compiling entry function '([^']+)'|Function properties for (\S+))", line)
        if m:
            current = m.group(1) or m.group(2)
            out.setdefault(current, {})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[current].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                                spill_load_bytes=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[current]["registers"] = int(m.group(1))
    return {k: v for k, v in out.items() if v}


def ptxas_usage(cu_file: str | Path, cp: ModuleType) -> tuple[dict[str, dict[str, int]], list[str]] | None:
    """Compile ``cu_file`` once more with ``-Xptxas -v``: per kernel registers and spill bytes, and
    ptxas's own lines (to show them as the compiler printed them). None without nvcc (NVRTC
    does not print them; :func:`kernel_attributes` still gives registers and local memory)."""
    import subprocess
    import tempfile

    nvcc = find_nvcc()
    if nvcc is None:
        return None
    arch = f"sm_{cp.cuda.Device().compute_capability}"
    with tempfile.TemporaryDirectory(prefix="gpuprof-ptxas-") as tmp:
        proc = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-lineinfo", "-std=c++17", "-Xptxas", "-v",
                               "-o", str(Path(tmp) / "k.cubin"), str(cu_file)],
                              capture_output=True, text=True, timeout=600, check=False)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return None
    lines = [line.strip() for line in text.splitlines() if "ptxas info" in line or "bytes stack frame" in line]
    return parse_ptxas_verbose(text), lines


def kernel_attributes(kernel: Any) -> dict[str, int]:
    """Registers per thread and local memory per thread of a loaded kernel, as the driver reports them."""
    return {"registers": int(kernel.num_regs), "local_bytes": int(kernel.local_size_bytes)}


@dataclass
class Variant:
    """One kernel (or library call) to time: how to launch it once and what one launch does.

    ``work`` is the bytes one launch moves (for ``unit="GB/s"``) or the floating-point
    operations it performs (``unit="TFLOP/s"``).
    """

    name: str
    label: str
    launch: Callable[[], object]
    work: float
    unit: str = "GB/s"
    check: Callable[[], str] | None = None  # returns a sentence, raises GpuprofError when wrong
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    name: str
    label: str
    median_ms: float
    q1_ms: float
    q3_ms: float
    rate: float  # work per second, in ``unit``
    unit: str
    checked: str
    extra: dict[str, Any] = field(default_factory=dict)


def bench(variants: Sequence[Variant], backend: Backend, *, warmup: int = 2, repeats: int = 10,
          progress: Callable[[str], None] | None = print) -> list[Result]:
    """Time each variant (inside NVTX ranges ``timed`` and its name), then run its check."""
    results = []
    scale = {"GB/s": 1e9, "TFLOP/s": 1e12, "Gop/s": 1e9}
    for v in variants:
        with process_range("timed"), annotate(v.name):
            t = time_call(v.launch, backend=backend, warmup=warmup, repeats=repeats)
        checked = v.check() if v.check else "not checked"
        rate = v.work / t.median / scale[v.unit] if t.median > 0 else float("nan")
        lo, hi = t.iqr
        r = Result(v.name, v.label, t.median * 1e3, lo * 1e3, hi * 1e3, rate, v.unit, checked, dict(v.extra))
        results.append(r)
        if progress:
            progress(f"  {v.label:<44} {r.median_ms:9.3f} ms  {r.rate:9.1f} {v.unit}   {checked}")
    return results


def format_results(results: Sequence[Result], reference: Result | None = None, ref_label: str = "") -> str:
    """A fixed-width table: time, rate, and each row against ``reference`` (e.g. the first step)."""
    lines = [f"{'kernel':<44}{'median':>11}{'rate':>16}" + (f"{ref_label:>14}" if reference else "")]
    for r in results:
        row = f"{r.label:<44}{r.median_ms:>8.3f} ms{r.rate:>9.1f} {r.unit:<7}"
        if reference:
            row += f"{reference.median_ms / r.median_ms:>13.2f}x"
        lines.append(row)
    return "\n".join(lines)


def write_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    """Write a script's results with the machine that produced them (no-op when ``path`` is None)."""
    if path is None:
        return
    payload = {"machine": describe_machine().as_dict(), **payload}
    for key, value in list(payload.items()):
        if isinstance(value, list) and value and isinstance(value[0], Result):
            payload[key] = [asdict(r) for r in value]
    Path(path).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    from .cli import shown_path

    print(f"results written to {shown_path(path)}")


def build_cuda_example(source: str | Path) -> list[str] | None:
    """Compile a course .cu file with nvcc for this GPU into a temporary folder.

    Returns the argument list that runs it, or None (with the reason printed) when
    there is no GPU or no nvcc: the caller then falls back to the reference capture.
    """
    import subprocess
    import tempfile

    from .runner import shell_line

    machine = describe_machine()
    nvcc = find_nvcc()
    if machine.device != "cuda" or not nvcc:
        print("Not building " + Path(source).name + ": " + ("there is no GPU on this machine." if machine.device != "cuda"
                                                             else "nvcc was not found (set NVCC or add it to PATH)."))
        return None
    arch = "sm_" + (machine.compute_capability or "9.0").replace(".", "")
    out = Path(tempfile.mkdtemp(prefix="gpuprof-build-")) / Path(source).stem
    cmd = [nvcc, f"-arch={arch}", "-o", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    print("$ " + shell_line(["nvcc", f"-arch={arch}", "-o", Path(source).stem, str(source)]))
    if proc.returncode != 0:
        print(f"nvcc failed: {proc.stderr.strip()[-400:]}")
        return None
    return [str(out)]
