#!/usr/bin/env python3
"""What GPU memory allocation costs, and how PyTorch's caching allocator hides it.

Sections (all by default, or pick with --sections), each inside an NVTX range of its name:

  caching          allocate and free the same size repeatedly: after the first call
                   PyTorch's caching allocator reuses its block, with no cudaMalloc
  raw              the same, but with torch.cuda.empty_cache() after every free, so
                   every allocation is a real cudaMalloc and every free a cudaFree
  churn            a loop whose temporary tensors change size every step (the cache
                   keeps growing new blocks), versus the same loop at one size
  pinned_host      pinned host memory (cudaHostAlloc, page-locking) versus pageable,
                   fresh sizes each time so PyTorch's pinned-memory cache cannot help

Profile it with --cuda-memory-usage=true to see device memory over time:

  nsys profile --trace=cuda,nvtx --cuda-memory-usage=true --sample=none --cpuctxsw=none \\
      -o alloc python examples/nsys/memory_allocation.py

On a CPU-only machine it times NumPy allocations instead, so it runs everywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import annotate, exit_on_error  # noqa: E402
from gpuprof.backend import torch_backend_or_cpu  # noqa: E402
from gpuprof.cli import (add_sections_argument, bounded_int, output_file, positive_int, require_memory,  # noqa: E402
                         resolve_sections)
from gpuprof.errors import GpuprofError  # noqa: E402

SECTIONS = ("caching", "raw", "churn", "pinned_host")
MIB = 1 << 20
MAX_ITERATIONS = 100_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sections_argument(p, SECTIONS)
    p.add_argument("--size-mib", type=positive_int, default=64, help="allocation size (default: 64)")
    p.add_argument("--iterations", type=bounded_int(MAX_ITERATIONS, "each can be a real cudaMalloc and cudaFree: a hundred "
                                                         "thousand already take minutes"),
                   default=50, help=f"allocations per section (default: 50, at most {MAX_ITERATIONS:,})")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    p.add_argument("--backend", choices=["torch", "cpu"], default=None, help="force a backend (default: torch CUDA, else CPU)")
    args = p.parse_args(argv)
    args.sections = resolve_sections(p, args.sections, SECTIONS)
    return args


class Allocations:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.backend = torch_backend_or_cpu(args.backend, "memory_allocation.py studies PyTorch's caching allocator")
        self.gpu = self.backend.is_gpu
        import numpy as np

        self.np = np
        if self.gpu:
            import torch

            self.torch = torch
        self.results: dict[str, dict[str, float]] = {}

    def stats(self) -> dict[str, int]:
        """The caching allocator's own counters: how many real cudaMalloc/cudaFree calls it made."""
        if not self.gpu:
            return {}
        s = self.torch.cuda.memory_stats()
        return {"cudaMalloc": int(s.get("num_device_alloc", -1)), "cudaFree": int(s.get("num_device_free", -1)),
                "reserved_mib": int(s.get("reserved_bytes.all.current", 0)) // MIB}

    def timed(self, fn, n: int) -> float:  # type: ignore[no-untyped-def]
        """Microseconds per call of ``fn`` over ``n`` calls, device synchronised at both ends."""
        self.backend.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        self.backend.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    def alloc(self, nbytes: int):  # type: ignore[no-untyped-def]
        if self.gpu:
            return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
        return self.np.empty(nbytes, dtype=self.np.uint8)

    def report(self, name: str, row: dict[str, float], before: dict[str, int]) -> None:
        after = self.stats()
        if after:
            row["cudaMalloc_calls"] = after["cudaMalloc"] - before["cudaMalloc"]
            row["cudaFree_calls"] = after["cudaFree"] - before["cudaFree"]
        self.results[name] = row
        print("  " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

    # -- sections ----------------------------------------------------------------------
    def caching(self) -> None:
        n, it = self.args.size_mib * MIB, self.args.iterations
        if self.gpu:
            self.torch.cuda.empty_cache()
        before = self.stats()
        t_first = self.timed(lambda i: self.alloc(n), 1)  # a cold cache: one real cudaMalloc
        t_rest = self.timed(lambda i: self.alloc(n), it)
        self.report("caching", {"first_us": t_first, "each_after_us": t_rest}, before)

    def raw(self) -> None:
        n, it = self.args.size_mib * MIB, self.args.iterations
        if self.gpu:
            self.torch.cuda.empty_cache()  # start from an empty cache, as the caching section did
        before = self.stats()

        def alloc_free_release(i: int) -> None:
            x = self.alloc(n)
            del x
            if self.gpu:
                self.torch.cuda.empty_cache()  # hand the block back to the driver: the anti-pattern

        self.report("raw", {"each_us": self.timed(alloc_free_release, it)}, before)

    def churn(self) -> None:
        it = self.args.iterations
        rng = self.np.random.default_rng(0)
        sizes = [int(s) * MIB for s in rng.integers(1, 4 * self.args.size_mib, it)]
        if self.gpu:
            self.torch.cuda.empty_cache()
        before = self.stats()
        with annotate("varying_sizes"):
            t_vary = self.timed(lambda i: self.alloc(sizes[i]), it)
        mid = self.stats()
        with annotate("one_size"):
            t_same = self.timed(lambda i: self.alloc(self.args.size_mib * MIB), it)
        row = {"varying_us": t_vary, "one_size_us": t_same}
        if mid:
            row["varying_cudaMalloc"] = mid["cudaMalloc"] - before["cudaMalloc"]
            row["reserved_after_mib"] = mid["reserved_mib"]
        self.report("churn", row, mid or before)

    def pinned_host(self) -> None:
        it = max(1, self.args.iterations // 5)
        base = self.args.size_mib * MIB
        if self.gpu:
            pinned = self.timed(lambda i: self.torch.empty(base + i * 4096, dtype=self.torch.uint8, pin_memory=True), it)
            pageable = self.timed(lambda i: self.torch.empty(base + i * 4096, dtype=self.torch.uint8).fill_(1), it)
            row = {"pinned_us": pinned, "pageable_touched_us": pageable, "pinned_over_pageable": pinned / pageable}
        else:
            pageable = self.timed(lambda i: self.np.ones(base + i * 4096, dtype=self.np.uint8), it)
            row = {"pageable_touched_us": pageable}
        self.report("pinned_host", row, self.stats())


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    a = Allocations(args)
    # the churn section's largest block is 4 x --size-mib (the others hold one --size-mib block at a time)
    require_memory(4 * args.size_mib * MIB, "cuda" if a.gpu else "cpu",
                   f"The churn section's largest allocation ({4 * args.size_mib:,} MiB)", "--size-mib")
    if a.gpu and "pinned_host" in args.sections:
        require_memory(args.size_mib * MIB, "cpu", f"A pinned host buffer of {args.size_mib:,} MiB", "--size-mib")
    print(f"memory_allocation: {a.backend}" + ("" if a.gpu else " (no GPU: NumPy host allocations stand in)"))
    for name in args.sections:
        print(f"[{name}]")
        with annotate(name):
            getattr(a, name)()
    if a.gpu and "caching" in a.results and "raw" in a.results:
        r = a.results
        cached, raw = r["caching"].get("cudaMalloc_calls", -1), r["raw"].get("cudaMalloc_calls", -1)
        if not (0 < cached <= 2 and raw == args.iterations):
            raise GpuprofError(f"unexpected allocator behaviour: caching made {cached} cudaMalloc calls, raw {raw}",
                               f"Expected one or two for caching (whatever the iterations) and {args.iterations} for raw.")
        print(f"result checked: {args.iterations + 1} allocations made {cached} cudaMalloc calls through the cache, "
              f"and {raw} without it")
    else:
        print("result checked: allocations completed (allocator counters need a GPU)")
    if args.json:
        args.json.write_text(json.dumps(a.results, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
