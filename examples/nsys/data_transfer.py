#!/usr/bin/env python3
"""Host-device transfers, done slowly and done well: a script written to be read on a timeline.

Sections (run all, or pick with --sections), each inside an NVTX range of its name:

  pageable_vs_pinned  H2D and D2H copies from pageable and from pinned host memory
  pin_per_call        .pin_memory() on every call versus one pinned buffer reused
  d2h_sync            three queued matrix products, then: .cpu() (blocks the CPU, copies
                      into fresh pageable memory); a blocking copy into a pinned buffer
                      allocated before; a non_blocking copy into it plus an event
  overlap             the same chunked copy + compute, first serialised on one stream,
                      then overlapped: copies on a second stream, double-buffered
  curve               H2D bandwidth over transfer sizes from 4 KiB to --curve-max-mib

The measurements run their warm-up calls inside NVTX ranges named ``warmup`` (overlap's warm-up repetition
runs inside its own ``serial`` and ``overlapped`` ranges), and
each section's correctness checks run after the section's range has closed (inside a
``check_results`` range), so that a capture's timed ranges hold the timed work only.

Profile it with

  nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none -o transfer python examples/nsys/data_transfer.py

On a CPU-only machine it runs the same sections with host memory copies (NumPy), so
it completes everywhere, but the interesting part needs a CUDA GPU and PyTorch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import annotate, exit_on_error, time_call  # noqa: E402
from gpuprof.backend import torch_backend_or_cpu  # noqa: E402
from gpuprof.cli import add_sections_argument, output_file, positive_int, require_memory, resolve_sections  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

SECTIONS = ("pageable_vs_pinned", "pin_per_call", "d2h_sync", "overlap", "curve")
MIB = 1 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sections_argument(p, SECTIONS)
    p.add_argument("--size-mib", type=positive_int, default=256, help="transfer size for the first sections (default: 256)")
    p.add_argument("--chunks", type=positive_int, default=8, help="chunks in the overlap section (default: 8)")
    p.add_argument("--chunk-mib", type=positive_int, default=64, help="size of one chunk (default: 64)")
    p.add_argument("--curve-max-mib", type=positive_int, default=1024, help="largest transfer of the curve (default: 1024)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats per measurement (default: 5)")
    p.add_argument("--profiler-range", default=None, metavar="SECTION",
                   help="wrap this section in cudaProfilerStart/Stop, for nsys --capture-range=cudaProfilerApi")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    p.add_argument("--backend", choices=["torch", "cpu"], default=None, help="force a backend (default: torch CUDA, else CPU)")
    args = p.parse_args(argv)
    args.sections = chosen = resolve_sections(p, args.sections, SECTIONS)
    if args.profiler_range is not None and args.profiler_range not in chosen:
        p.error(f"--profiler-range {args.profiler_range!r} is not one of the sections being run")
    return args


class Transfers:
    """The measurements, on PyTorch with CUDA or on NumPy (host copies only)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.backend = torch_backend_or_cpu(args.backend, "data_transfer.py needs PyTorch for its CUDA path (streams, pinned tensors)")
        self.gpu = self.backend.is_gpu
        self.results: dict[str, object] = {"backend": str(self.backend)}
        self.checked: list[str] = []
        self.pending: list[tuple[object, object, str]] = []  # checks to run once the section's range has closed
        if self.gpu:
            import torch

            self.torch = torch
        else:
            import numpy as np

            self.np = np

    # -- helpers ---------------------------------------------------------------------
    def host(self, nbytes: int, pinned: bool):  # type: ignore[no-untyped-def]
        if self.gpu:
            return self.torch.ones(nbytes, dtype=self.torch.uint8, pin_memory=pinned)
        return self.np.ones(nbytes, dtype=self.np.uint8)

    def device(self, nbytes: int):  # type: ignore[no-untyped-def]
        if self.gpu:
            return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
        return self.np.empty(nbytes, dtype=self.np.uint8)

    def copy(self, dst, src, non_blocking: bool = False) -> None:  # type: ignore[no-untyped-def]
        if self.gpu:
            dst.copy_(src, non_blocking=non_blocking)
        else:
            self.np.copyto(dst, src)

    def check_equal(self, a, b, what: str) -> None:  # type: ignore[no-untyped-def]
        """Ask for a check that a copy copied: a benchmark of a wrong copy measures nothing.

        The check itself runs later (:meth:`run_checks`), after the section's NVTX range has
        closed: comparing GPU data means copying it to the host, and that copy inside a timed
        range would be counted with the copies the range measures.
        """
        self.pending.append((a, b, what))

    def run_checks(self) -> None:
        """Run the checks the last section asked for; fail loudly on the first copy that did not copy."""
        for a, b, what in self.pending:
            same = bool(self.torch.equal(a.cpu(), b.cpu())) if self.gpu else bool(self.np.array_equal(a, b))
            if not same:
                raise GpuprofError(f"{what} produced different bytes than its source.", "This is a bug; please report it.")
            self.checked.append(what)
        self.pending.clear()

    def warm_up(self, fn, calls: int = 2) -> None:  # type: ignore[no-untyped-def]
        """Call ``fn`` ``calls`` times inside a ``warmup`` range and wait for the GPU, so that a capture
        can tell these calls from the timed ones that follow."""
        with annotate("warmup"):
            for _ in range(calls):
                fn()
            self.backend.synchronize()

    def gbps(self, nbytes: int, fn) -> float:  # type: ignore[no-untyped-def]
        self.warm_up(fn)
        t = time_call(fn, backend=self.backend, warmup=0, repeats=self.args.repeats)
        return nbytes / t.median / 1e9

    # -- sections ----------------------------------------------------------------------
    def pageable_vs_pinned(self) -> None:
        n = self.args.size_mib * MIB
        pageable, pinned, dev = self.host(n, False), self.host(n, True), self.device(n)
        rows = {}
        with annotate("h2d_pageable"):
            rows["h2d_pageable"] = self.gbps(n, lambda: self.copy(dev, pageable))
        with annotate("h2d_pinned"):
            rows["h2d_pinned"] = self.gbps(n, lambda: self.copy(dev, pinned, non_blocking=True))
        with annotate("d2h_pageable"):
            rows["d2h_pageable"] = self.gbps(n, lambda: self.copy(pageable, dev))
        with annotate("d2h_pinned"):
            rows["d2h_pinned"] = self.gbps(n, lambda: self.copy(pinned, dev, non_blocking=True))
        self.check_equal(dev, pinned, "H2D and D2H copies (pinned)")
        self.check_equal(dev, pageable, "D2H copy into pageable memory")
        self.results["pageable_vs_pinned"] = rows
        for k, v in rows.items():
            print(f"  {k:<14} {v:8.1f} GB/s  ({self.args.size_mib} MiB)")
        print(f"  pinned/pageable H2D: {rows['h2d_pinned'] / rows['h2d_pageable']:.2f}x")

    def pin_per_call(self) -> None:
        n = self.args.size_mib * MIB
        pageable, dev = self.host(n, False), self.device(n)
        once = self.host(n, True)

        def every() -> None:
            # one range per call: its CPU time is pin_memory()'s, a pinned block (PyTorch's caching host
            # allocator: cudaHostAlloc the first time, the cached block after) and a host memcpy into it
            with annotate("pin_and_copy"):
                if self.gpu:
                    dev.copy_(pageable.pin_memory(), non_blocking=True)
                else:
                    self.np.copyto(dev, self.np.array(pageable))

        with annotate("pin_every_call"):
            self.warm_up(every, calls=1)
            t_every = time_call(every, backend=self.backend, warmup=0, repeats=self.args.repeats)
        with annotate("pin_once"):
            copy_once = lambda: self.copy(dev, once, non_blocking=True)  # noqa: E731
            self.warm_up(copy_once, calls=1)
            t_once = time_call(copy_once, backend=self.backend, warmup=0, repeats=self.args.repeats)
        self.results["pin_per_call"] = {"every_call_ms": t_every.median * 1e3, "once_ms": t_once.median * 1e3}
        print(f"  pin on every call {t_every.median * 1e3:8.2f} ms   pinned once {t_once.median * 1e3:8.2f} ms   "
              f"({t_every.median / t_once.median:.1f}x)")

    def d2h_sync(self) -> None:
        if not self.gpu:
            print("  (no GPU: nothing runs asynchronously on the CPU, so there is nothing to wait for)")
            self.results["d2h_sync"] = {}
            return
        torch = self.torch
        a = torch.randn(4096, 4096, device="cuda")
        out_pinned = torch.empty(4096, 4096, pin_memory=True)  # allocated once, before anything is timed
        with annotate("first_matmul"):
            # the process's first matrix product: cuBLAS loads and creates its handle here, so that
            # it is not what the ranges below measure; then a first .cpu()
            _ = (a @ a).cpu()
            torch.cuda.synchronize()
        with annotate("blocking_cpu_copy"):
            b = a @ a @ a @ a  # three matrix products, queued: a few ms of GPU work
            t0 = time.perf_counter()
            fresh = b.cpu()  # the CPU waits here for the products, then for the copy into new pageable memory
            blocked = time.perf_counter() - t0
        self.check_equal(b, fresh, ".cpu() of the products")
        with annotate("blocking_pinned_copy"):
            b = a @ a @ a @ a
            t0 = time.perf_counter()
            out_pinned.copy_(b)  # blocking too, but into the pinned buffer: the wait without the pageable copy
            blocked_pinned = time.perf_counter() - t0
        with annotate("non_blocking_copy"):
            b = a @ a @ a @ a
            t0 = time.perf_counter()
            out_pinned.copy_(b, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            returned = time.perf_counter() - t0  # the CPU is free to do other work from here
            done.synchronize()
        self.check_equal(b, out_pinned, "non_blocking D2H copy into the pinned buffer")
        self.results["d2h_sync"] = {"cpu_blocked_ms": blocked * 1e3, "cpu_blocked_pinned_ms": blocked_pinned * 1e3,
                                    "cpu_returned_ms": returned * 1e3}
        print(f"  .cpu() held the CPU {blocked * 1e3:.2f} ms; a blocking copy into the pinned buffer "
              f"{blocked_pinned * 1e3:.2f} ms; the non_blocking copy returned after {returned * 1e3:.3f} ms")

    def _compute(self, x, passes: int) -> None:  # type: ignore[no-untyped-def]
        for _ in range(passes):
            x.mul_(1.0001).add_(0.0001)

    def overlap(self) -> None:
        if not self.gpu:
            print("  (no GPU: no copy engines or streams to overlap)")
            self.results["overlap"] = {}
            return
        torch = self.torch
        n, chunks = self.args.chunk_mib * MIB // 4, self.args.chunks
        host = [torch.randn(n).pin_memory() for _ in range(chunks)]
        dev = [torch.empty(n, device="cuda") for _ in range(2)]  # double buffer
        # Calibrate: enough compute passes per chunk that compute takes about as long as the copy.
        t_copy = time_call(lambda: dev[0].copy_(host[0], non_blocking=True), backend=self.backend, warmup=1, repeats=3)
        t_pass = time_call(lambda: self._compute(dev[1], 1), backend=self.backend, warmup=1, repeats=3)
        passes = max(1, round(t_copy.median / t_pass.median))
        copy_stream = torch.cuda.Stream()

        def serial() -> None:
            for i in range(chunks):
                with annotate(f"chunk_{i}"):
                    buf = dev[i % 2]
                    buf.copy_(host[i], non_blocking=True)
                    self._compute(buf, passes)

        def overlapped() -> None:
            ready = [torch.cuda.Event() for _ in range(chunks)]
            free = [torch.cuda.Event() for _ in range(2)]
            for i in range(chunks):
                with annotate(f"chunk_{i}"):
                    buf = dev[i % 2]
                    with torch.cuda.stream(copy_stream):
                        if i >= 2:
                            copy_stream.wait_event(free[i % 2])  # do not overwrite a buffer still being computed on
                        buf.copy_(host[i], non_blocking=True)
                        ready[i].record(copy_stream)
                    torch.cuda.current_stream().wait_event(ready[i])
                    self._compute(buf, passes)
                    free[i % 2].record()

        with annotate("serial"):
            t_serial = time_call(serial, backend=self.backend, warmup=1, repeats=self.args.repeats)
        with annotate("overlapped"):
            t_over = time_call(overlapped, backend=self.backend, warmup=1, repeats=self.args.repeats)
        torch.cuda.synchronize()
        last = dev[(chunks - 1) % 2].clone()
        serial()
        torch.cuda.synchronize()
        self.check_equal(last, dev[(chunks - 1) % 2], "overlapped chunk pipeline (vs serial)")
        bound = chunks * max(t_copy.median, passes * t_pass.median)
        self.results["overlap"] = {"passes": passes, "copy_ms": t_copy.median * 1e3, "compute_ms": passes * t_pass.median * 1e3,
                                   "serial_ms": t_serial.median * 1e3, "overlapped_ms": t_over.median * 1e3,
                                   "bound_ms": bound * 1e3}
        print(f"  {chunks} chunks of {self.args.chunk_mib} MiB; per chunk: copy {t_copy.median * 1e3:.2f} ms, "
              f"compute {passes} passes {passes * t_pass.median * 1e3:.2f} ms")
        print(f"  serial {t_serial.median * 1e3:.2f} ms, overlapped {t_over.median * 1e3:.2f} ms "
              f"({t_serial.median / t_over.median:.2f}x faster; lower bound {bound * 1e3:.2f} ms)")

    def curve(self) -> None:
        sizes, size = [], 4 * 1024
        while size <= self.args.curve_max_mib * MIB:
            sizes.append(size)
            size *= 4
        rows = []
        biggest = sizes[-1]
        pinned, pageable, dev = self.host(biggest, True), self.host(biggest, False), self.device(biggest)
        for nbytes in sizes:
            with annotate(f"curve_{nbytes}"):
                src_p, src_q, dst = pinned[:nbytes], pageable[:nbytes], dev[:nbytes]
                rows.append({"bytes": nbytes,
                             "pinned_gbps": self.gbps(nbytes, lambda: self.copy(dst, src_p, non_blocking=True)),
                             "pageable_gbps": self.gbps(nbytes, lambda: self.copy(dst, src_q))})
        self.check_equal(dev[:sizes[0]], pageable[:sizes[0]], "curve copies")
        self.results["curve"] = rows
        print(f"  {'size':>10} {'pinned GB/s':>12} {'pageable GB/s':>14}")
        for r in rows:
            print(f"  {r['bytes'] / 1024:>8.0f} K {r['pinned_gbps']:12.2f} {r['pageable_gbps']:14.2f}")


def memory_needed(args: argparse.Namespace) -> tuple[int, int]:
    """(host bytes, device bytes) the chosen sections hold at their peak, each section on its own:
    checked before anything is allocated, so that a size the machine cannot hold is refused in a
    sentence instead of failing half-way through the run."""
    per_section = {
        "pageable_vs_pinned": (2 * args.size_mib, args.size_mib),
        "pin_per_call": (3 * args.size_mib, args.size_mib),
        "d2h_sync": (128, 512),  # fixed: 64 MiB matrices (the three results kept for the checks), two host copies
        "overlap": (args.chunks * args.chunk_mib, 2 * args.chunk_mib),
        "curve": (2 * args.curve_max_mib, args.curve_max_mib),
    }
    host = max(per_section.get(s, (0, 0))[0] for s in args.sections)
    dev = max(per_section.get(s, (0, 0))[1] for s in args.sections)
    return host * MIB, dev * MIB


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    host, dev = memory_needed(args)
    t = Transfers(args)
    if t.gpu:
        require_memory(host, "cpu", "These sections", "--size-mib, --curve-max-mib or --chunks x --chunk-mib")
        require_memory(dev, "cuda", "These sections", "--size-mib, --curve-max-mib or --chunk-mib")
    else:  # the 'device' buffers are host memory too
        require_memory(host + dev, "cpu", "These sections", "--size-mib, --curve-max-mib or --chunks x --chunk-mib")
    print(f"data_transfer: {t.backend}" + ("" if t.gpu else " (no GPU: host memory copies stand in for transfers)"))
    for name in args.sections:
        print(f"[{name}]")
        bracket = t.gpu and name == args.profiler_range
        if bracket:
            t.torch.cuda.profiler.start()  # cudaProfilerStart: nsys --capture-range=cudaProfilerApi begins here
        with annotate(name):
            getattr(t, name)()
        if bracket:
            t.torch.cuda.synchronize()  # let the section's GPU work finish inside the range
            t.torch.cuda.profiler.stop()
        if t.pending:
            with annotate("check_results"):  # after the section's range: its copies are not the section's
                t.run_checks()
    if args.json:
        args.json.write_text(json.dumps(t.results, indent=2) + "\n")
        print(f"results written to {args.json}")
    print(f"result checked: {', '.join(t.checked) or 'nothing to check in these sections'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
