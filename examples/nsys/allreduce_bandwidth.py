#!/usr/bin/env python3
"""All-reduce bandwidth against message size, as nccl-tests reports it, beside a plain GPU-to-GPU copy.

Every rank all-reduces a buffer of each size (--sizes) --iterations times back to back, in
--repeats windows; the time of one all-reduce is a window's mean, taken on the slowest rank
(a collective is done when its last rank is), and the best window counts (anything else
running on the machine can only make a window slower). Two bandwidths per size, defined as nccl-tests defines them
(its PERFORMANCE.md):

  algorithm bandwidth  algbw = bytes / time
  bus bandwidth        busbw = algbw * 2 (n - 1) / n    (n ranks; for all-reduce)

The bus bandwidth is comparable with the speed of the slowest link, whatever the number of
ranks: a ring all-reduce moves 2 (n - 1) / n times the buffer through every link. Before
the all-reduces, rank 0 times a plain copy of --copy-mb MiB from GPU 0 to GPU 1 and back
(the other ranks wait on the CPU; the best of 10 copies each way), the peak that the bus
bandwidth is judged against.

Examples:
  torchrun --standalone --nproc-per-node 2 examples/nsys/allreduce_bandwidth.py
  torchrun --standalone --nproc-per-node 2 examples/nsys/allreduce_bandwidth.py --sizes 1M,64M,1G --json ar.json

Without torchrun it runs as one process, where an all-reduce has nobody to talk to (it says
so). On a CPU it uses gloo, with sizes up to 4 MiB by default; the copy needs two GPUs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int, require_memory  # noqa: E402
from gpuprof.distributed import join_group, torchrun_place  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

GPU_SIZES = "4K,64K,1M,4M,16M,64M,256M,1G"
CPU_SIZES = "4K,64K,1M,4M"
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def size_list(text: str) -> list[int]:
    """argparse type: sizes in bytes with optional K/M/G (powers of 1024), separated by commas."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", part, flags=re.IGNORECASE)
        if not m or int(m.group(1)) == 0:
            raise argparse.ArgumentTypeError(f"expected sizes like 4K,1M,1G, got {part!r}")
        out.append(int(m.group(1)) * UNITS[m.group(2).upper()])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=size_list, default=None,
                   help=f"message sizes in bytes (default: {GPU_SIZES} on GPUs, {CPU_SIZES} on a CPU)")
    p.add_argument("--iterations", type=positive_int, default=20, help="timed all-reduces per size (default: 20)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed windows per size; the best counts (default: 5)")
    p.add_argument("--warmup", type=nonnegative_int, default=5, help="untimed all-reduces per size first (default: 5)")
    p.add_argument("--copy-mb", type=nonnegative_int, default=1024,
                   help="MiB for the GPU 0 -> GPU 1 copy; 0 skips it (default: 1024)")
    p.add_argument("--cpu", action="store_true", help="use the CPU (gloo) even where GPUs are available")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="rank 0 writes the table to FILE")
    return p.parse_args(argv)


def bus_factor(world: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for all-reduce: 2 (n - 1) / n."""
    return 2 * (world - 1) / world


def peer_copy(torch: Any, nbytes: int, repeats: int = 10) -> list[dict[str, Any]]:
    """GB/s of a device-to-device copy GPU 0 -> GPU 1 and back: the best of ``repeats`` timed copies."""
    rows = []
    for src, dst in ((0, 1), (1, 0)):
        a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
        b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
        times = []
        for i in range(repeats + 2):
            torch.cuda.synchronize(src)
            torch.cuda.synchronize(dst)
            t0 = time.perf_counter()
            with annotate(f"copy_gpu{src}_to_gpu{dst}"):
                b.copy_(a)
                torch.cuda.synchronize(src)
                torch.cuda.synchronize(dst)
            if i >= 2:  # the first two enable peer access and warm up
                times.append(time.perf_counter() - t0)
        rows.append({"direction": f"GPU {src} -> GPU {dst}", "bytes": nbytes, "seconds": min(times),
                     "median_gbps": nbytes / statistics.median(times) / 1e9, "gbps": nbytes / min(times) / 1e9,
                     "peer_access": bool(torch.cuda.can_device_access_peer(src, dst))})
        del a, b
    return rows


def sweep(torch: Any, dist: Any, sizes: list[int], device: str, iterations: int, warmup: int,
          repeats: int = 1) -> list[dict[str, Any]]:
    """One row per size: the time of one all-reduce (the best window's mean, slowest rank), algbw and busbw in GB/s."""
    world = dist.get_world_size()
    gpu = device.startswith("cuda")
    rows = []
    for nbytes in sizes:
        # zeros, which stay zeros: an in-place sum of ones would double every call and overflow after ~128 calls
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        with annotate(f"allreduce_{nbytes}B"):
            for _ in range(warmup):
                dist.all_reduce(buf)
            if gpu:
                torch.cuda.synchronize()
            windows = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iterations):
                    dist.all_reduce(buf)
                if gpu:
                    torch.cuda.synchronize()
                windows.append((time.perf_counter() - t0) / iterations)
        slowest = torch.tensor(windows, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # per window, the slowest rank's time
        per_window = slowest.tolist()
        t = min(per_window)
        algbw = buf.numel() * 4 / t / 1e9
        rows.append({"bytes": buf.numel() * 4, "time_us": t * 1e6, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * bus_factor(world), "worst_window_us": max(per_window) * 1e6})
        del buf
    return rows


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("allreduce_bandwidth.py")
    import torch.distributed as dist

    rank, world, device = torchrun_place(torch, args.cpu)
    gpu = device.startswith("cuda")
    sizes = args.sizes or size_list(GPU_SIZES if gpu else CPU_SIZES)
    require_memory(max(sizes), "cuda" if gpu else "cpu", f"An all-reduce buffer of {max(sizes) / 2**30:,.2f} GiB", "--sizes")
    if gpu and rank == 0:
        require_memory(args.copy_mb * 2**20, "cuda", f"The peer copy's {args.copy_mb:,} MiB buffer", "--copy-mb")
    join_group(torch, rank, world, device)
    cpu_group = dist.new_group(backend="gloo")  # a barrier that runs no GPU kernel while rank 0 copies
    try:
        copies: list[dict[str, Any]] = []
        copy_note = ""
        if not gpu:
            copy_note = "no GPU copy: this run is on the CPU"
        elif torch.cuda.device_count() < 2:
            copy_note = "no GPU copy: this machine has one GPU"
        elif args.copy_mb == 0:
            copy_note = "no GPU copy: --copy-mb 0"
        elif rank == 0:
            copies = peer_copy(torch, args.copy_mb * 2**20)
        dist.barrier(group=cpu_group)
        if rank == 0:
            name = torch.cuda.get_device_name() if gpu else "CPU"
            print(f"allreduce_bandwidth: {world} rank(s) on {name} ({dist.get_backend()}), "
                  f"best of {args.repeats} windows of {args.iterations} all-reduces per size, FP32 buffers", flush=True)
            for c in copies:
                print(f"  copy {c['direction']}: {c['gbps']:.1f} GB/s ({c['bytes'] / 2**20:.0f} MiB, peer access "
                      f"{'on' if c['peer_access'] else 'off'})", flush=True)
            if copy_note:
                print(f"  ({copy_note})")
            if world == 1:
                print("  one rank: an all-reduce has nobody to exchange with, so these times are not communication "
                      "(start it with torchrun --nproc-per-node N)", flush=True)
        rows = sweep(torch, dist, sizes, device, args.iterations, args.warmup, args.repeats)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    print(f"  {'size':>10}  {'time (us)':>10}  {'algbw GB/s':>10}  {'busbw GB/s':>10}")
    for r in rows:
        print(f"  {r['bytes']:>10,}  {r['time_us']:>10.1f}  {r['algbw_gbps']:>10.2f}  {r['busbw_gbps']:>10.2f}")
    if any(not r["time_us"] > 0 for r in rows):
        raise GpuprofError("an all-reduce took no measurable time: the timer or the sweep is broken.")
    peak = max((c["gbps"] for c in copies), default=None)
    best = max(r["busbw_gbps"] for r in rows)
    print(f"result checked: {len(rows)} sizes all-reduced by {world} rank(s); best bus bandwidth {best:.1f} GB/s"
          + (f" = {best / peak:.0%} of the copy peak {peak:.1f} GB/s" if peak and world > 1 else ""))
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"world_size": world, "backend": "nccl" if gpu else "gloo", "iterations": args.iterations, "repeats": args.repeats,
                               "bus_factor": bus_factor(world), "copies": copies, "copy_note": copy_note, "rows": rows,
                               "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
