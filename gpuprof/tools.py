"""Find Nsight Systems (``nsys``) and Nsight Compute (``ncu``) the way a reader's machine has them.

Order: the ``NSYS`` / ``NCU`` environment variable, then ``PATH``, then the folders the
installers use (``/opt/nvidia/nsight-systems/<ver>/bin``, ``/usr/local/cuda/bin``, and
the copy of ``nsys`` that ships inside Nsight Compute). Newer versions win among
install folders. Also: the tool's version, and whether this user may read the GPU's
performance counters (``ERR_NVGPUCTRPERM``), which ``ncu`` needs and ``nsys`` does not.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import GpuprofError, ToolNotFound

__all__ = [
    "Tool", "find_tool", "tool_version", "CounterAccess", "profiling_restricted",
    "check_counter_access", "COUNTER_PERMISSION_HINT", "live_tool", "LiveTool", "require_tool",
]

_ENV = {"nsys": "NSYS", "ncu": "NCU"}

# Folder patterns per tool; each may match several versions.
_INSTALL_GLOBS = {
    "nsys": [
        "/opt/nvidia/nsight-systems/*/bin/nsys",
        "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
        "/usr/local/cuda*/bin/nsys",
        "/usr/local/cuda*/nsight-systems-*/bin/nsys",
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    ],
    "ncu": [
        "/usr/local/cuda*/bin/ncu",
        "/opt/nvidia/nsight-compute/*/ncu",
        "/usr/local/cuda*/nsight-compute-*/ncu",
    ],
}

_INSTALL_HINT = {
    "nsys": (
        "Install Nsight Systems (the CUDA toolkit's `cuda-nsight-systems` package, or the "
        "standalone installer from developer.nvidia.com/nsight-systems), or point the NSYS "
        "variable at the nsys executable."
    ),
    "ncu": (
        "Install Nsight Compute (it comes with the CUDA toolkit as `cuda-nsight-compute`, or "
        "from developer.nvidia.com/nsight-compute), or point the NCU variable at the ncu executable."
    ),
}

COUNTER_PERMISSION_HINT = (
    "Run ncu as root (sudo), or ask an administrator to allow profiling for all users: "
    "put `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in a file under "
    "/etc/modprobe.d/ and reload the nvidia driver (or reboot); in a container, start it "
    "with `--cap-add=SYS_ADMIN`. The course's troubleshooting page explains the security trade-off."
)


@dataclass(frozen=True)
class Tool:
    """A located profiler executable and how we found it."""

    name: str
    path: Path
    found_via: str  # "NSYS variable", "PATH", or "install folder"

    def __str__(self) -> str:
        return f"{self.name} at {self.path} (found via {self.found_via})"


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def _version_key(path: str) -> tuple[int, ...]:
    nums = re.findall(r"(\d{4})\.(\d+)\.(\d+)", path) or re.findall(r"cuda-?(\d+)\.(\d+)()", path)
    if not nums:
        return (0,)
    return tuple(int(x) if x else 0 for x in nums[-1])


def _install_candidates(name: str, globs: Sequence[str] | None = None) -> list[Path]:
    found: list[str] = []
    for pattern in globs if globs is not None else _INSTALL_GLOBS[name]:
        found.extend(glob.glob(pattern))
    found.sort(key=_version_key, reverse=True)
    return [Path(p) for p in found if _is_exe(Path(p))]


def find_tool(name: str, *, install_globs: Sequence[str] | None = None) -> Tool:
    """Locate ``nsys`` or ``ncu``; raise :class:`ToolNotFound` with an install hint.

    An environment variable that points at something that is not an executable is an
    error (the reader set it on purpose and should know it is wrong), not a reason to
    quietly use another copy.
    """
    if name not in _ENV:
        raise GpuprofError(f"Unknown tool {name!r}.", "This course uses 'nsys' and 'ncu'.")
    var = _ENV[name]
    value = os.environ.get(var, "").strip()
    if value:
        p = Path(value).expanduser()
        if _is_exe(p):
            return Tool(name, p, f"{var} variable")
        raise ToolNotFound(f"{var} is set to {value!r}, which is not an executable file.", f"Fix or unset {var}.")
    on_path = shutil.which(name)
    if on_path:
        return Tool(name, Path(on_path), "PATH")
    candidates = _install_candidates(name, install_globs)
    if candidates:
        return Tool(name, candidates[0], "install folder")
    raise ToolNotFound(f"{name} was not found (not in {var}, not on PATH, not in the usual install folders).",
                       _INSTALL_HINT[name])


def tool_version(tool: Tool, timeout: float = 60) -> str:
    """The tool's version number, e.g. ``2025.3.1.0``, read from ``--version``."""
    try:
        proc = subprocess.run([str(tool.path), "--version"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GpuprofError(f"Could not run {tool.path} --version: {exc}.",
                           "Check that the file is a working Nsight executable.") from None
    text = proc.stdout + proc.stderr
    m = re.search(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)", text)
    if not m:
        raise GpuprofError(f"{tool.path} --version printed no version number: {text.strip()[:200]!r}.",
                           "Check that the file is a working Nsight executable.")
    return m.group(1)


def profiling_restricted(params_file: Path = Path("/proc/driver/nvidia/params")) -> bool | None:
    """True if the driver restricts counters to admins, False if not, None if unknown.

    The driver publishes its setting as ``RmProfilingAdminOnly`` in its params file.
    Root is never restricted. Whether ncu can really read counters is settled only by
    trying it: see :func:`check_counter_access`.
    """
    try:
        text = params_file.read_text()
    except OSError:
        return None
    m = re.search(r"RmProfilingAdminOnly:\s*(\d)", text)
    if not m:
        return None
    return m.group(1) == "1" and os.geteuid() != 0


@dataclass(frozen=True)
class CounterAccess:
    """Outcome of asking ncu for one hardware counter."""

    status: str  # "ok", "denied", or "unknown"
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def classify_ncu_output(text: str, returncode: int) -> CounterAccess:
    """Read ncu's output and decide whether counters were readable.

    Kept apart from :func:`check_counter_access` so it can be tested on the real
    messages without a GPU.
    """
    if "ERR_NVGPUCTRPERM" in text:
        return CounterAccess("denied", "ncu reported ERR_NVGPUCTRPERM: this user may not read GPU "
                                       "performance counters. " + COUNTER_PERMISSION_HINT)
    if "No kernels were profiled" in text:
        return CounterAccess("unknown", "ncu ran but profiled no kernel, so counter access is untested "
                                        "(check the kernel filter and that the program used the GPU).")
    if returncode == 0 and re.search(r"==PROF== (Profiling|Disconnected)", text):
        return CounterAccess("ok", "ncu read hardware counters.")
    tail = " ".join(text.strip().splitlines()[-3:])[:300]
    return CounterAccess("unknown", f"ncu exited with status {returncode}: {tail}")


def check_counter_access(ncu: Tool, target: Sequence[str], kernel_regex: str, timeout: float = 240) -> CounterAccess:
    """Profile one kernel of ``target`` (an argument list) for one metric, and classify.

    ``--clock-control none`` leaves the GPU clocks as they are, which shared
    machines require; the trade-off is explained in the Nsight Compute chapter.
    """
    cmd = [str(ncu.path), "--clock-control", "none", "--metrics", "sm__cycles_elapsed.max",
           "--kernel-name", f"regex:{kernel_regex}", "--launch-count", "1", *target]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return CounterAccess("unknown", f"ncu did not finish within {timeout:.0f} s.")
    except OSError as exc:
        return CounterAccess("unknown", f"ncu could not be started: {exc}.")
    return classify_ncu_output(proc.stdout + proc.stderr, proc.returncode)


@dataclass(frozen=True)
class LiveTool:
    """Whether a live capture with a profiler is possible here: the tool and its version, or the reason not.

    True when it is; unpacks as ``tool, version`` (both None when it is not), so a caller
    with a fallback writes ``if not live: ...use live.reason...`` and then ``nsys, version = live``.
    """

    tool: Tool | None
    version: str | None = None
    reason: str = ""

    def __bool__(self) -> bool:
        return self.tool is not None

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter((self.tool, self.version))


def live_tool(name: str) -> LiveTool:
    """The tool and its version when a live capture is possible here (a GPU and the tool), else the reason it is not."""
    from .backend import describe_machine

    if describe_machine().device != "cuda":
        return LiveTool(None, reason="there is no GPU on this machine")
    try:
        tool = find_tool(name)
        return LiveTool(tool, tool_version(tool))
    except GpuprofError as exc:
        return LiveTool(None, reason=str(exc))


def require_tool(name: str, doing: str = "", error: type[GpuprofError] = GpuprofError) -> tuple[Tool, str]:
    """``(tool, version)`` for a measurement that has no fallback; else raises ``error`` saying why.

    The message is ``"<doing>: <reason>."``, ``doing`` defaulting to "<name> cannot run here".
    """
    live = live_tool(name)
    if not live:
        raise error(f"{doing or name + ' cannot run here'}: {live.reason}.")
    return live.tool, live.version  # type: ignore[return-value]
