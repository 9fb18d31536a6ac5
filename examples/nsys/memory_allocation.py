#!/usr/bin/env python3
"""What GPU memory allocation costs, and how PyTorch's caching allocator hides it.

Sections (all by default, or pick with --sections), each inside an NVTX range of its name:

  caching          allocate and free the same size repeatedly: after the first call
                   PyTorch's caching allocator reuses its block, with no cudaMalloc
  raw              the same, but with torch.cuda.empty_cache() after every free, so
                   every allocation is a real cudaMalloc and every free a cudaFree
  churn            a loop whose temporary tensors change size every step (the cache
                   keeps growing new blocks), versus the same loop at one size
  pinned_host      pinned host memory (tensors with pin_memory=True) versus pageable.
                   PyTorch serves pinned tensors from its caching host allocator, which
                   rounds each request up to a power of two, asks CUDA (cudaHostAlloc)
                   only when no cached block fits, and keeps freed blocks: the
                   ``pinned_cached`` range shows what that costs; ``pinned_uncached``
                   empties that cache after every free, so that every allocation is a
                   real cudaHostAlloc (and every release a cudaFreeHost)

--allocator cudaMallocAsync runs the device sections under PyTorch's other allocator
backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync): every allocation and free is a
cudaMallocAsync / cudaFreeAsync call into CUDA's stream-ordered memory pool, which keeps
freed memory itself, and empty_cache() trims that pool (cudaMemPoolTrimTo).

Profile it with --cuda-memory-usage=true to see device memory over time:

  nsys profile --trace=cuda,nvtx --cuda-memory-usage=true --sample=none --cpuctxsw=none \\
      -o alloc python examples/nsys/memory_allocation.py

On a CPU-only machine it times NumPy allocations instead, so it runs everywhere.
"""

from __future__ import annotations

import argparse
import json
import os
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
ALLOCATORS = ("native", "cudaMallocAsync")  # PyTorch's names for its two CUDA allocator backends
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sections_argument(p, SECTIONS)
    p.add_argument("--size-mib", type=positive_int, default=64, help="allocation size (default: 64)")
    p.add_argument("--iterations", type=bounded_int(MAX_ITERATIONS, "each can be a real cudaMalloc and cudaFree: a hundred "
                                                         "thousand already take minutes"),
                   default=50, help=f"allocations per section (default: 50, at most {MAX_ITERATIONS:,})")
    p.add_argument("--allocator", choices=ALLOCATORS, default="native",
                   help="PyTorch's CUDA allocator backend: its caching allocator (native, the default) or CUDA's "
                        f"stream-ordered pool (cudaMallocAsync); set through {ALLOC_CONF} before CUDA starts")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    p.add_argument("--backend", choices=["torch", "cpu"], default=None, help="force a backend (default: torch CUDA, else CPU)")
    args = p.parse_args(argv)
    args.sections = resolve_sections(p, args.sections, SECTIONS)
    conf = os.environ.get(ALLOC_CONF, "")
    if "backend:" in conf and f"backend:{args.allocator}" not in conf:
        p.error(f"{ALLOC_CONF}={conf!r} already names another backend than --allocator {args.allocator}")
    return args


def pinned_size(size_mib: int, i: int) -> int:
    """The i-th pinned request: --size-mib, then 4 KiB more each time (64 MiB, then just over it, which PyTorch's
    host cache rounds up to the next power of two, 128 MiB)."""
    return size_mib * MIB + i * 4096


def choose_allocator(allocator: str) -> None:
    """Ask PyTorch for ``allocator`` through ``PYTORCH_CUDA_ALLOC_CONF``; it is read once, when CUDA
    starts, so this must run before the first CUDA call (PyTorch is not imported before it)."""
    conf = os.environ.get(ALLOC_CONF, "")
    if allocator != "native" and f"backend:{allocator}" not in conf:
        os.environ[ALLOC_CONF] = ",".join(filter(None, [conf, f"backend:{allocator}"]))


def empty_host_cache(torch) -> None:  # type: ignore[no-untyped-def]
    """Return PyTorch's cached pinned blocks to CUDA (``cudaFreeHost``). The public name came after the
    private ones; PyTorch 2.11 has ``torch._C._host_emptyCache``."""
    for owner, name in ((getattr(torch, "accelerator", None), "empty_host_cache"), (torch._C, "_host_emptyCache"),
                        (torch._C, "_accelerator_emptyHostCache")):
        fn = getattr(owner, name, None)
        if callable(fn):
            fn()
            return
    raise GpuprofError(f"PyTorch {torch.__version__} has no way to empty its pinned-memory cache here.",
                       "Run the other sections: --sections caching,raw,churn.")


class Allocations:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.backend = torch_backend_or_cpu(args.backend, "memory_allocation.py studies PyTorch's caching allocator")
        self.gpu = self.backend.is_gpu
        import numpy as np

        self.np = np
        self.allocator = "none (no GPU)"
        if self.gpu:
            import torch

            self.torch = torch
            torch.empty(1, device="cuda")  # start CUDA, so that the backend in use can be asked
            torch.cuda.empty_cache()  # and release that first block: the sections start from an empty cache
            self.allocator = torch.cuda.get_allocator_backend()
            if self.allocator != args.allocator:
                raise GpuprofError(f"PyTorch runs the {self.allocator} allocator, not {args.allocator}.",
                                   f"Was CUDA started before {ALLOC_CONF} was set?")
        self.results: dict[str, dict[str, float]] = {}

    def stats(self) -> dict[str, int]:
        """The caching allocator's own counters: how many real cudaMalloc/cudaFree calls it made.

        Only the native allocator keeps them: under cudaMallocAsync every allocation is a call into
        CUDA's pool, and the capture's cudaMallocAsync rows are the count."""
        if not self.gpu or self.allocator != "native":
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
        if after and before:  # a section that makes no device allocation passes no counters
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

    def host_allocs(self) -> int:
        """cudaHostAlloc calls PyTorch's caching host allocator has made (-1 where it does not say)."""
        stats = getattr(self.torch.cuda, "host_memory_stats", None)
        return int(stats().get("num_host_alloc", -1)) if stats else -1

    def pinned_host(self) -> None:
        it = max(1, self.args.iterations // 5)
        size = lambda i: pinned_size(self.args.size_mib, i)  # noqa: E731
        if not self.gpu:
            pageable = self.timed(lambda i: self.np.ones(size(i), dtype=self.np.uint8), it)
            self.report("pinned_host", {"pageable_touched_us": pageable}, {})
            return
        torch = self.torch
        empty_host_cache(torch)
        before = self.host_allocs()
        with annotate("pinned_cached"):
            cached = self.timed(lambda i: torch.empty(size(i), dtype=torch.uint8, pin_memory=True), it)
        mid = self.host_allocs()
        empty_host_cache(torch)  # the blocks pinned_cached kept would serve the first request below

        def fresh(i: int) -> None:
            x = torch.empty(size(i), dtype=torch.uint8, pin_memory=True)
            del x
            empty_host_cache(torch)  # the freed block goes back to CUDA: the next request finds no cache

        with annotate("pinned_uncached"):
            uncached = self.timed(fresh, it)
        after = self.host_allocs()
        with annotate("pageable_touched"):
            pageable = self.timed(lambda i: torch.empty(size(i), dtype=torch.uint8).fill_(1), it)
        row = {"pinned_cached_us": cached, "pinned_uncached_us": uncached, "pageable_touched_us": pageable,
               "uncached_over_pageable": uncached / pageable}
        if before >= 0:
            row["cached_cudaHostAlloc"], row["uncached_cudaHostAlloc"] = mid - before, after - mid
        self.report("pinned_host", row, {})


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    choose_allocator(args.allocator)
    a = Allocations(args)
    # the churn section's largest block is 4 x --size-mib (the others hold one --size-mib block at a time)
    require_memory(4 * args.size_mib * MIB, "cuda" if a.gpu else "cpu",
                   f"The churn section's largest allocation ({4 * args.size_mib:,} MiB)", "--size-mib")
    if a.gpu and "pinned_host" in args.sections:
        # the host cache rounds a request up to the next power of two: just over --size-mib takes twice that
        require_memory(2 * args.size_mib * MIB, "cpu", f"A pinned host block of {2 * args.size_mib:,} MiB", "--size-mib")
    print(f"memory_allocation: {a.backend}, allocator {a.allocator}" + ("" if a.gpu else " (no GPU: NumPy host allocations stand in)"))
    for name in args.sections:
        print(f"[{name}]")
        with annotate(name):
            getattr(a, name)()
    checked = []
    r = a.results
    if a.gpu and a.allocator == "native" and "caching" in r and "raw" in r:
        cached, raw = r["caching"].get("cudaMalloc_calls", -1), r["raw"].get("cudaMalloc_calls", -1)
        if not (0 < cached <= 2 and raw == args.iterations):
            raise GpuprofError(f"unexpected allocator behaviour: caching made {cached} cudaMalloc calls, raw {raw}",
                               f"Expected one or two for caching (whatever the iterations) and {args.iterations} for raw.")
        checked.append(f"{args.iterations + 1} allocations made {cached} cudaMalloc calls through the cache, "
                       f"and {raw} without it")
    pinned = r.get("pinned_host", {})
    if "uncached_cudaHostAlloc" in pinned:
        it = max(1, args.iterations // 5)
        cached, uncached = pinned["cached_cudaHostAlloc"], pinned["uncached_cudaHostAlloc"]
        blocks = len({1 << (pinned_size(args.size_mib, i) - 1).bit_length() for i in range(it)})  # one per power of two
        if not (0 < cached <= blocks and uncached == it):
            raise GpuprofError(f"unexpected host allocator behaviour: {it} pinned tensors made {cached} cudaHostAlloc "
                               f"calls through the cache and {uncached} without it",
                               f"Expected at most {blocks} through the cache (one per power of two) and {it} without it.")
        checked.append(f"{it} pinned tensors made {cached} cudaHostAlloc calls through the host cache, and {uncached} "
                       "with it emptied after each")
    print("result checked: " + ("; ".join(checked) if checked else
                                "allocations completed (the allocators' counters need a GPU and the native allocator)"))
    if args.json:
        args.json.write_text(json.dumps(a.results, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
