"""Which array library runs the course's GPU work here, and what machine this is.

Every chapter must run on a reader's GPU box and on a CPU-only laptop or CI runner.
:func:`choose_backend` picks, in order, PyTorch on a CUDA GPU, CuPy on a CUDA GPU,
then the CPU (PyTorch's CPU build when it is installed, else NumPy). The choice is
said out loud by :func:`describe_machine`, whose one-line summary opens every
notebook, so that every number in the book sits next to the hardware that made it.

``GPUPROF_BACKEND`` (``torch``, ``cupy``, ``cpu``) forces a choice, e.g. to compare
the CuPy path on a machine that also has PyTorch.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import GpuprofError

__all__ = ["Backend", "MachineInfo", "choose_backend", "describe_machine", "gpu_available", "host_description",
           "require_torch", "torch_device", "torch_backend_or_cpu"]

BACKEND_ENV = "GPUPROF_BACKEND"
_CHOICES = ("torch", "cupy", "cpu")


@dataclass(frozen=True)
class Backend:
    """An array library bound to a device.

    ``name`` is ``torch``, ``cupy`` or ``numpy``; ``device`` is ``cuda`` or ``cpu``.
    ``xp`` is the module itself, so code can say ``backend.xp.ones(...)`` where the
    libraries agree, and branch on ``name`` where they do not.
    """

    name: str
    device: str
    xp: ModuleType = field(repr=False, compare=False)

    @property
    def is_gpu(self) -> bool:
        return self.device == "cuda"

    def synchronize(self) -> None:
        """Wait for all queued GPU work; a no-op on the CPU.

        GPU launches return before the work is done, so any host-side clock read
        without this first measures the launch, not the work.
        """
        if not self.is_gpu:
            return
        if self.name == "torch":
            self.xp.cuda.synchronize()
        else:
            self.xp.cuda.runtime.deviceSynchronize()

    def __str__(self) -> str:
        return f"{self.name} on {self.device}"


def _try_import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a broken CUDA install raising on import
        return None


def _torch_cuda() -> Backend | None:
    torch = _try_import("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return Backend("torch", "cuda", torch)
    except Exception:
        return None
    return None


def _cupy_cuda() -> Backend | None:
    cupy = _try_import("cupy")
    if cupy is None:
        return None
    try:
        if cupy.cuda.is_available():
            cupy.cuda.runtime.getDeviceCount()
            return Backend("cupy", "cuda", cupy)
    except Exception:  # e.g. CUDARuntimeError: insufficient driver
        return None
    return None


def _cpu() -> Backend:
    torch = _try_import("torch")
    if torch is not None:
        return Backend("torch", "cpu", torch)
    import numpy

    return Backend("numpy", "cpu", numpy)


def choose_backend(prefer: str | None = None) -> Backend:
    """Return the best available backend: torch CUDA, then CuPy, then the CPU.

    ``prefer`` (or the ``GPUPROF_BACKEND`` variable) forces ``torch``, ``cupy`` or
    ``cpu``; a forced GPU backend that is not usable here is an error, not a silent
    fallback, because the reader asked for it by name.
    """
    prefer = (prefer or os.environ.get(BACKEND_ENV) or "").strip().lower() or None
    if prefer is not None and prefer not in _CHOICES:
        raise GpuprofError(
            f"Unknown backend {prefer!r}.", f"Choose one of {', '.join(_CHOICES)} (or unset {BACKEND_ENV})."
        )
    if prefer == "cpu":
        return _cpu()
    if prefer == "torch":
        found = _torch_cuda()
        if found is None:
            raise GpuprofError(
                "PyTorch with a usable CUDA GPU was asked for, but not found.",
                "Check `nvidia-smi` and `python -c 'import torch; print(torch.cuda.is_available())'`.",
            )
        return found
    if prefer == "cupy":
        found = _cupy_cuda()
        if found is None:
            raise GpuprofError(
                "CuPy with a usable CUDA GPU was asked for, but not found.",
                "Install the cupy-cudaXXx wheel that matches your driver's CUDA version.",
            )
        return found
    return _torch_cuda() or _cupy_cuda() or _cpu()


def gpu_available() -> bool:
    """True when torch or CuPy can use a CUDA GPU here."""
    return choose_backend().is_gpu


@dataclass
class MachineInfo:
    """What produced a number: the provenance every chapter prints first."""

    backend: str
    device: str
    gpu_name: str | None = None
    driver_version: str | None = None
    cuda_runtime: str | None = None
    compute_capability: str | None = None
    gpu_memory_gib: float | None = None
    sm_count: int | None = None
    pcie_gen: int | None = None  # the link generation and width the GPU and slot allow
    pcie_width: int | None = None
    gpu_count: int | None = None  # GPUs visible to this process (the first one is described)
    cpu_model: str = ""
    cpu_count: int = 0
    cpu_mhz: float | None = None  # the clock /proc/cpuinfo reports for the first CPU (a VM reports its host's base)
    virtual_machine: bool | None = None  # the CPU flags say "hypervisor": a guest; launch costs include the VM's
    python: str = ""
    libraries: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: the GPU and its driver, or plainly that this is a CPU-only run."""
        libs = ", ".join(f"{k} {v}" for k, v in self.libraries.items())
        if self.device != "cuda":
            return (
                f"CPU only (no CUDA GPU visible): {self.cpu_model or 'unknown CPU'}, "
                f"{self.cpu_count} cores; backend {self.backend}; {libs}"
            )
        parts = [(f"{self.gpu_count} x " if (self.gpu_count or 1) > 1 else "") + (self.gpu_name or "unknown GPU")]
        if self.driver_version:
            parts.append(f"driver {self.driver_version}")
        if self.cuda_runtime:
            parts.append(f"CUDA runtime {self.cuda_runtime}")
        if self.gpu_memory_gib is not None:
            parts.append(f"{self.gpu_memory_gib:.1f} GiB")
        if self.sm_count:
            parts.append(f"{self.sm_count} SMs")
        if self.compute_capability:
            parts.append(f"sm_{self.compute_capability.replace('.', '')}")
        if self.pcie_gen and self.pcie_width:
            parts.append(f"PCIe gen{self.pcie_gen} x{self.pcie_width}")
        return " | ".join(parts) + f"; backend {self.backend}; {libs}"

    @property
    def gpus(self) -> int:
        """How many CUDA GPUs this process can use (0 on a CPU-only machine)."""
        return (self.gpu_count or 1) if self.device == "cuda" else 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_facts() -> tuple[float | None, bool | None]:
    """(the first CPU's clock in MHz, whether its flags name a hypervisor), from /proc/cpuinfo; None where unknown."""
    mhz = vm = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "cpu MHz" and mhz is None:
                mhz = float(value)
            elif key.strip() == "flags" and vm is None:
                vm = "hypervisor" in value.split()
            if mhz is not None and vm is not None:
                break
    except (OSError, ValueError):
        pass
    return mhz, vm


def host_description(machine: dict[str, Any]) -> str:
    """The host CPU as a machine record states it: model, cores, clock, and whether it is a virtual machine.

    Launch-bound results depend on it (a kernel launch is CPU work), so chapters whose steps the
    CPU limits print it beside their numbers. Records made before the clock was kept say so.
    """
    text = f"{machine.get('cpu_model') or 'an unnamed CPU'}, {machine.get('cpu_count') or '?'} logical cores"
    mhz = machine.get("cpu_mhz")
    text += f" at {mhz / 1000:.2f} GHz" if mhz else " (clock not recorded)"
    vm = machine.get("virtual_machine")
    return text + ({True: ", a virtual machine", False: ", bare metal"}.get(vm, "") if vm is not None else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (e.g. ``580.159.04``), or None without one.

    Read from ``/proc/driver/nvidia/version`` when the kernel module exposes it,
    else from ``nvidia-smi``; the CUDA runtime cannot tell it.
    """
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=False,
            ).stdout.strip().splitlines()
            if out:
                return out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def pcie_link() -> tuple[int | None, int | None]:
    """PCIe generation and lane count (maximum the GPU and slot support), from nvidia-smi.

    The *maximum* rather than the current value: an idle GPU drops its link to a lower
    generation to save power, so the current value read between runs misleads.
    """
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None, None
    try:
        out = subprocess.run([smi, "--query-gpu=pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False).stdout.strip().splitlines()
        gen, width = (int(x) for x in out[0].split(","))
        return gen, width
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None, None


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("torch", "cupy", "numpy"):
        mod = sys.modules.get(name) or _try_import(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "?"))
    return out


@lru_cache(maxsize=1)
def describe_machine() -> MachineInfo:
    """Describe this machine and the backend the course will use on it (cached)."""
    backend = choose_backend()
    cpu = _cpu_facts()
    info = MachineInfo(
        backend=backend.name,
        device=backend.device,
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count() or 0,
        cpu_mhz=cpu[0],
        virtual_machine=cpu[1],
        python=platform.python_version(),
        libraries=_versions(),
    )
    if not backend.is_gpu:
        return info
    info.driver_version = driver_version()
    info.pcie_gen, info.pcie_width = pcie_link()
    if backend.name == "torch":
        torch = backend.xp
        props = torch.cuda.get_device_properties(0)
        info.gpu_name = props.name
        info.gpu_memory_gib = props.total_memory / 2**30
        info.sm_count = props.multi_processor_count
        info.compute_capability = f"{props.major}.{props.minor}"
        info.cuda_runtime = torch.version.cuda
        info.gpu_count = torch.cuda.device_count()
    else:
        cupy = backend.xp
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        info.gpu_name = name.decode() if isinstance(name, bytes) else str(name)
        info.gpu_memory_gib = props["totalGlobalMem"] / 2**30
        info.sm_count = int(props["multiProcessorCount"])
        info.compute_capability = f"{props['major']}.{props['minor']}"
        v = cupy.cuda.runtime.runtimeGetVersion()
        info.cuda_runtime = f"{v // 1000}.{(v % 1000) // 10}"
        info.gpu_count = cupy.cuda.runtime.getDeviceCount()
    return info


def require_torch(script: str):  # type: ignore[no-untyped-def]
    """``import torch`` for a script that cannot run without PyTorch: one sentence, not a traceback, if it is missing."""
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
    backend = choose_backend(choice)
    if backend.is_gpu and backend.name != "torch":
        raise GpuprofError(f"{why}; CuPy alone is not enough.", "Install a CUDA build of PyTorch, or pass --backend cpu.")
    return backend
