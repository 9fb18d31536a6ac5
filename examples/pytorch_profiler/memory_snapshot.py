#!/usr/bin/env python3
"""Record where CUDA memory goes during two training steps, with PyTorch's allocator history.

Turns on ``torch.cuda.memory._record_memory_history()`` (the replacement for the
profiler's deprecated ``export_memory_timeline``), runs the small CNN's first two
training steps, and writes the allocator's log: every allocation and free, with the
line of Python that asked for it. The end of each phase (forward, backward,
optimizer_step) is marked in the log by a block of a size nothing else uses, so the
reader (gpuprof.torch_profiler.memory) can say which phase allocated and which freed
each block, and name it: activations kept for backward, gradients, optimizer state...

The log is checked before it is written: the memory it says is allocated at the end,
plus what was allocated before recording started, must match
``torch.cuda.memory_allocated()``, and its peak ``max_memory_allocated()``, within the
allocator's rounding (the log holds the sizes requested; the allocator counts blocks:
rounded up to 512 bytes, and a large block can be handed out whole, up to 1 MiB more).

Needs a GPU (the allocator history is CUDA's); on a CPU it says so and analyses the
course's reference log (artifacts/ch05) instead.

Examples:
  python examples/pytorch_profiler/memory_snapshot.py --log memory.json.gz
  python examples/pytorch_profiler/memory_snapshot.py --batch 512 --pickle snapshot.pickle
      (open snapshot.pickle at https://pytorch.org/memory_viz to browse it)
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_int, shown_path  # noqa: E402

PHASES = ("forward", "backward", "optimizer_step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=positive_int, default=256, help="images per step (default: 256)")
    p.add_argument("--steps", type=positive_int, default=2, help="training steps recorded (default: 2)")
    p.add_argument("--log", type=output_file, default=Path("memory_log.json.gz"), metavar="FILE",
                   help="the compact allocator log (JSON, gzipped if FILE ends in .gz; default: memory_log.json.gz)")
    p.add_argument("--pickle", type=output_file, default=None, metavar="FILE",
                   help="also write the full snapshot (torch.cuda.memory._dump_snapshot), for pytorch.org/memory_viz")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the run's summary to FILE")
    return p.parse_args(argv)


def analyse(tm, log: dict):  # type: ignore[no-untyped-def]
    """Check a log against the allocator's counters it carries, and print its categories."""
    labels = log["phases"]
    entries, ends = tm.split_markers(tm.trace_entries(log), labels)
    life = tm.categorise(tm.lifetimes(entries), ends, labels)
    print(tm.check_against_allocator(life, len(entries), log["baseline_bytes"], log["end_allocated_bytes"],
                                     log["peak_allocated_bytes"], extra_peak=tm.marker_bytes(len(labels))))
    by = life.groupby("category")["bytes"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    for cat, r in by.iterrows():
        print(f"  {cat:<32} {int(r['size']):>5} blocks {r['sum'] / 2**20:9.1f} MiB allocated over the steps")
    return entries, by


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("memory_snapshot.py")
    from gpuprof.torch_profiler import memory as tm

    if not torch.cuda.is_available():
        from gpuprof.artifacts import find_capture

        found = find_capture("ch05", "memory_log.json.gz", prefer="reference")
        print("memory_snapshot.py: no GPU here, and CUDA's allocator history needs one: nothing recorded. "
              f"Reading the course's reference log instead ({found.describe()})")
        log = tm.read_snapshot(found.path)
        analyse(tm, log)
        print("result checked: the reference log agrees with the allocator counters it was recorded with")
        return 0
    from gpuprof.models import check_loss_fell, require_training_memory, small_cnn, synthetic_batch, train_step

    torch.manual_seed(0)
    require_training_memory(small_cnn, (3, 32, 32), args.batch, "cuda", "--batch", optimizer_states=1)  # SGD, momentum
    model = small_cnn().to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = synthetic_batch(args.batch, "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    print(f"memory_snapshot: {args.steps} training steps of batch {args.batch} on {torch.cuda.get_device_name()}; "
          f"{baseline / 2**20:.1f} MiB allocated before recording (parameters and the batch)", flush=True)

    labels: list[str] = []

    def mark(step: int, phase: str) -> None:
        """End a phase: allocate and free a block of this phase's marker size."""
        block = torch.empty(tm.marker_bytes(len(labels)), dtype=torch.uint8, device="cuda")
        del block
        labels.append(f"{step}:{phase}")

    def annotate(phase: str):  # type: ignore[no-untyped-def]
        import contextlib

        @contextlib.contextmanager
        def ctx():  # type: ignore[no-untyped-def]
            yield
            mark(step, phase)
        return ctx()

    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python")
    losses = []
    try:
        for step in range(args.steps):
            loss = train_step(model, opt, x, y, annotate=annotate)
            losses.append(loss)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        if args.pickle:
            torch.cuda.memory._dump_snapshot(str(args.pickle))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    end_allocated = torch.cuda.memory_allocated()
    peak = torch.cuda.max_memory_allocated()
    print(check_loss_fell([float(v.item()) for v in losses]) if args.steps > 1 else "one step: loss not checked")

    log = tm.compact(snapshot, device=torch.cuda.current_device(), phases=labels, baseline_bytes=baseline,
                     batch=args.batch, torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                     end_allocated_bytes=end_allocated, peak_allocated_bytes=peak)
    entries, by = analyse(tm, log)

    data = json.dumps(log).encode()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    args.log.write_bytes(gzip.compress(data, mtime=0) if args.log.name.endswith(".gz") else data)
    print(f"log written to {shown_path(args.log)} ({args.log.stat().st_size / 1e3:.0f} kB)" +
          (f"; full snapshot {shown_path(args.pickle)} ({args.pickle.stat().st_size / 1e6:.1f} MB)" if args.pickle else ""))
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"batch": args.batch, "steps": args.steps, "torch": torch.__version__,
                               "baseline_bytes": baseline, "end_allocated_bytes": end_allocated,
                               "peak_allocated_bytes": peak, "events": len(entries), "log": str(args.log),
                               "by_category": {str(k): int(v) for k, v in by["sum"].items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
