#!/usr/bin/env python3
"""Data-parallel training with DistributedDataParallel, marked for Nsight Systems: is communication hidden?

A stack of linear layers (``--width``, ``--depth``: many parameters, so many gradient bytes
to all-reduce) trained on random data with SGD, one process per GPU, started with torchrun.
DDP all-reduces the gradients bucket by bucket (``--bucket-mb``) while backward is still
running; the question this script lets a capture answer is how much of that communication
the backward pass hides.

NVTX ranges, per rank: ``rank_R`` around the whole run; ``bucket_<MB>MB`` around each bucket
size's run (``--bucket-mb`` takes a list: the sizes run one after another in the same
processes, so one capture compares them); inside it ``warmup`` and ``step_N``, and inside a
step ``forward``, ``backward`` (DDP launches its all-reduces from it) and ``optimizer``;
``straggling`` where --slow-rank sleeps.

Levers:
  --bucket-mb MB[,MB...]  DDP's gradient bucket cap, bucket_cap_mb, in MiB (default: 25, the cap DDP uses
                          when none is given; given, it also caps the first bucket, which DDP's unset
                          default keeps small: ddp_buckets.py shows the layouts)
  --accumulate K          K micro-batches per optimizer step, the first K-1 under no_sync()
                          (gradients all-reduced once per step instead of once per micro-batch)
  --bf16                  autocast to bfloat16 (gradients stay FP32)
  --slow-rank R           make rank R a straggler: it sleeps --slow-ms before each backward
  --max-ctas N            cap NCCL's thread blocks (channels) per collective for this process group
                          alone, through its communicator's config (ncclConfig_t maxCTAs), where
                          NCCL_MAX_NCHANNELS caps every communicator of the process
  --high-priority         NCCL's collectives on a high-priority CUDA stream (ProcessGroupNCCL.Options)
  --free-running          time the steps as a production loop runs them: no wait for the GPU after
                          each phase and no loss read each step, so the CPU can run ahead; each
                          step timed by CUDA events on the default stream (no phase times then)

DDP's own knobs (each off by default, as in DDP):
  --grad-as-bucket-view   DDP(gradient_as_bucket_view=True): gradients are views into the
                          all-reduce buckets, so DDP copies no gradient into a bucket and back
  --static-graph          DDP(static_graph=True): the same parameters are used every step
  --comm-hook HOOK        register a communication hook: bf16 or fp16 (compress each bucket
                          to 16 bits for the all-reduce: half the bytes, rounded gradients)
  --find-unused-parameters  DDP(find_unused_parameters=True): walks the autograd graph every
                          step to find parameters that got no gradient (none do here: its cost alone)
  --default-buckets       DDP without bucket_cap_mb, its real default: 25 MiB buckets with the
                          first one capped at 1 MiB (with --bucket-mb 25 only; ddp_buckets.py
                          shows both layouts)
  --no-sync               every backward under DDP's no_sync(): the same step with no all-reduce,
                          to measure what gradient synchronisation costs (the ranks' weights then
                          drift apart, each trained on its own data, so they are not checked)

``ddp_knobs.py``, beside this script, times these knobs against each other in one job.

Examples:
  torchrun --standalone --nproc-per-node 2 examples/nsys/ddp_training.py
  torchrun --standalone --nproc-per-node 2 examples/nsys/ddp_training.py --bucket-mb 1,25,1000
  torchrun --standalone --nproc-per-node 2 examples/nsys/ddp_training.py --slow-rank 1 --slow-ms 20
  one report per rank (nsys runs inside each rank, which knows its RANK):
  torchrun --standalone --nproc-per-node 2 --no-python \\
      nsys profile --trace=cuda,nvtx -o ddp_rank%q{RANK} python examples/nsys/ddp_training.py

Without torchrun it runs as one process (world size 1: on a GPU with NCCL, on a CPU with
gloo) and says that there is no communication to measure. Default sizes: width 2048,
depth 32, batch 512 per rank on a GPU; width 256, depth 8, batch 32 on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_float, positive_int  # noqa: E402
from gpuprof.distributed import join_group, torchrun_place  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

DDP_DEFAULT_BUCKET_MB = 25.0  # DDP's bucket_cap_mb when none is given (its first bucket is then capped at 1 MiB)
GPU_SIZES = {"width": 2048, "depth": 32, "batch_size": 512}
CPU_SIZES = {"width": 256, "depth": 8, "batch_size": 32}


def bucket_sizes(text: str) -> list[float]:
    """argparse type: one bucket size in MB, or several separated by commas."""
    try:
        sizes = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MB or MB,MB,... (numbers), got {text!r}") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"bucket sizes must be positive, got {text!r}")
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=positive_int, default=None, help="features of every layer (default: see below)")
    p.add_argument("--depth", type=positive_int, default=None, help="linear layers (default: see below)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="samples per micro-batch per rank")
    p.add_argument("--bucket-mb", type=bucket_sizes, default=[DDP_DEFAULT_BUCKET_MB], metavar="MB[,MB...]",
                   help="DDP bucket_cap_mb; several sizes run one after another (default: 25)")
    p.add_argument("--accumulate", type=positive_int, default=1, help="micro-batches per optimizer step (default: 1)")
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    p.add_argument("--grad-as-bucket-view", action="store_true", help="DDP(gradient_as_bucket_view=True)")
    p.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True)")
    p.add_argument("--comm-hook", choices=("none", "bf16", "fp16"), default="none",
                   help="compress buckets to bf16 or fp16 for the all-reduce (default: none)")
    p.add_argument("--find-unused-parameters", action="store_true", help="DDP(find_unused_parameters=True)")
    p.add_argument("--default-buckets", action="store_true",
                   help="leave bucket_cap_mb unset (DDP's default layout: 25 MiB, the first bucket 1 MiB)")
    p.add_argument("--no-sync", action="store_true", help="never all-reduce the gradients (DDP's no_sync())")
    p.add_argument("--slow-rank", type=nonnegative_int, default=None, help="the rank to slow down (default: none)")
    p.add_argument("--slow-ms", type=positive_float, default=10.0, help="its sleep before each backward (default: 10)")
    p.add_argument("--max-ctas", type=positive_int, default=None, metavar="N",
                   help="cap NCCL's thread blocks (channels) for this job's process group alone (ncclConfig_t maxCTAs)")
    p.add_argument("--high-priority", action="store_true", help="NCCL's collectives on a high-priority CUDA stream")
    p.add_argument("--free-running", action="store_true",
                   help="no per-phase synchronisation nor per-step loss read; steps timed by CUDA events")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps first, per bucket size (default: 3)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per bucket size (default: 10)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo) even where GPUs are available")
    p.add_argument("--torch-trace", type=output_file, default=None, metavar="PREFIX",
                   help="record the timed steps with torch.profiler too: PREFIX_rank<R>.json.gz per rank "
                        "(one bucket size only)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="rank 0 writes the configuration and every rank's step times to FILE")
    args = p.parse_args(argv)
    if args.torch_trace is not None and len(args.bucket_mb) > 1:
        p.error("--torch-trace records one configuration: give one --bucket-mb")
    if args.default_buckets and args.bucket_mb != [DDP_DEFAULT_BUCKET_MB]:
        p.error(f"--default-buckets is DDP's own {DDP_DEFAULT_BUCKET_MB:g} MB default: give no other --bucket-mb")
    return args


def setup(args: argparse.Namespace) -> tuple[Any, int, int, str]:
    """Join the process group torchrun describes, or make a group of one. Returns (torch, rank, world, device)."""
    torch = require_torch("ddp_training.py")
    rank, world, device = torchrun_place(torch, args.cpu)
    gpu = device.startswith("cuda")
    if args.slow_rank is not None and args.slow_rank >= world:
        raise GpuprofError(f"--slow-rank {args.slow_rank} does not exist: the world has {world} rank(s).",
                           "Pick a rank below the number of processes (torchrun --nproc-per-node).")
    for key, value in (GPU_SIZES if gpu else CPU_SIZES).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    from gpuprof.models import require_training_memory

    # SGD keeps no state, but DDP's buckets hold a second copy of the gradients: one "state"
    require_training_memory(lambda: build_model(args, torch, None), (args.width,), args.batch_size, device,
                            "--width, --depth or --batch-size", optimizer_states=1, half_precision=args.bf16)
    join_group(torch, rank, world, device, max_ctas=args.max_ctas, high_priority=args.high_priority)
    return torch, rank, world, device


def build_model(args: argparse.Namespace, torch: Any, device: str | None) -> Any:
    """The same initial weights on every rank (DDP would broadcast rank 0's anyway); ``device`` None leaves it where
    it was made (the memory check builds it on the meta device)."""
    from torch import nn

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers)
    return model if device is None else model.to(device)


def train(args: argparse.Namespace, torch: Any, rank: int, device: str, bucket_mb: float,
          model: Any = None) -> dict[str, Any]:
    """Warm up, then time --steps optimizer steps with one bucket size; per step the phases in ms.

    Times are host clock around synchronised phases: a step's wall time as the CPU sees it.
    ``model``: the module to wrap (trained in place); None builds a fresh one from seed 0.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    gpu = device.startswith("cuda")
    model = build_model(args, torch, device) if model is None else model
    ddp = DDP(model, device_ids=[int(device.split(":")[1])] if gpu else None,
              bucket_cap_mb=None if args.default_buckets else bucket_mb,
              gradient_as_bucket_view=args.grad_as_bucket_view, static_graph=args.static_graph,
              find_unused_parameters=args.find_unused_parameters)
    if args.comm_hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}[args.comm_hook]
        ddp.register_comm_hook(None, hook)  # None: the default process group
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(1 + rank)  # each rank its own data shard
    x = torch.randn(args.batch_size, args.width, device=device, generator=gen)
    y = torch.randn(args.batch_size, args.width, device=device, generator=gen)

    def autocast() -> Any:
        return torch.autocast("cuda" if gpu else "cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    def sync() -> None:
        # after each phase, so that its NVTX range and host-clock time mean what they say; a
        # production loop does not wait (--free-running), and where the CPU sets the pace that differs
        if gpu and not args.free_running:
            torch.cuda.synchronize()

    def step() -> dict[str, float]:
        t = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        for micro in range(args.accumulate):
            sync_now = micro == args.accumulate - 1 and not args.no_sync
            with contextlib.nullcontext() if sync_now else ddp.no_sync():
                t0 = time.perf_counter()
                with annotate("forward"), autocast():
                    loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
                sync()
                t1 = time.perf_counter()
                if rank == args.slow_rank:
                    with annotate("straggling"):
                        time.sleep(args.slow_ms / 1e3)
                with annotate("backward"):
                    loss.backward()  # with the last micro-batch, DDP all-reduces the buckets as they fill
                sync()
                t2 = time.perf_counter()
            t["forward"] += (t1 - t0) * 1e3
            t["backward"] += (t2 - t1) * 1e3
        t0 = time.perf_counter()
        with annotate("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        t["optimizer"] = (time.perf_counter() - t0) * 1e3
        if args.free_running:
            return {}  # host times of phases that were not waited for mean nothing; the loss is not read
        t["loss"] = float(loss.detach())
        return t

    steps = []
    with annotate(f"bucket_{bucket_mb:g}MB"):
        with annotate("warmup"):
            for _ in range(args.warmup):
                step()
        profiler = None
        if args.torch_trace is not None:
            from torch.profiler import ProfilerActivity, profile

            import warnings

            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")  # no schedule here
            profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else []))
            profiler.start()
        events = []
        for i in range(args.steps):
            with annotate(f"step_{i}"):
                t0 = time.perf_counter()
                if args.free_running and gpu:
                    events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                    events[-1][0].record()
                s = step()
                if args.free_running and gpu:
                    events[-1][1].record()
                s["step"] = (time.perf_counter() - t0) * 1e3  # on a GPU with --free-running, replaced below
            steps.append(s)
        if events:
            torch.cuda.synchronize()
            for s, (start, end) in zip(steps, events):
                s["step"] = start.elapsed_time(end)  # ms on the default stream, from the step's first queued work to its last
        if profiler is not None:
            profiler.stop()
            profiler.export_chrome_trace(trace_file(args.torch_trace, rank))
    # Every rank's weights must be identical after training: DDP averaged the same gradients everywhere.
    check = torch.stack([p.detach().float().sum() for p in model.parameters()]).sum().reshape(1)
    world = torch.distributed.get_world_size()
    gathered = [torch.zeros_like(check) for _ in range(world)]
    torch.distributed.all_gather(gathered, check)
    same = all(torch.allclose(g, gathered[0], rtol=1e-5) for g in gathered)
    buckets = ddp._get_ddp_logging_data().get("num_buckets_reduced") if hasattr(ddp, "_get_ddp_logging_data") else None
    return {"bucket_mb": bucket_mb, "steps": steps, "weights_identical_across_ranks": same, "buckets": buckets}


def knobs(args: argparse.Namespace) -> str:
    """DDP's knobs this run turned on, for the first line of its output."""
    on = [name for name, flag in (("gradient_as_bucket_view", args.grad_as_bucket_view), ("static_graph", args.static_graph),
                                  ("find_unused_parameters", args.find_unused_parameters),
                                  ("bucket_cap_mb unset (small first bucket)", args.default_buckets)) if flag]
    on += [f"{args.comm_hook}_compress_hook"] if args.comm_hook != "none" else []
    on += ["no gradient sync"] if args.no_sync else []
    on += [f"NCCL maxCTAs {args.max_ctas}"] if args.max_ctas is not None else []
    on += ["NCCL high-priority stream"] if args.high_priority else []
    return f", DDP: {', '.join(on)}" if on else ""


def placement(torch: Any, world: int, device: str) -> str:
    """Where the ranks run, for a script's first line: ``2 x NVIDIA H200`` or ``2 CPU process(es)``."""
    return f"{world} x {torch.cuda.get_device_name()}" if device.startswith("cuda") else f"{world} CPU process(es)"


def trace_file(prefix: Path, rank: int) -> str:
    return f"{prefix}_rank{rank}.json.gz"


def gradient_bytes(args: argparse.Namespace) -> int:
    """Bytes of FP32 gradients all-reduced per optimizer step (weights and biases of every layer)."""
    return args.depth * (args.width * args.width + args.width) * 4


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per bucket size and rank: median step and phase times."""
    lines = []
    for r in results:
        for config in r["configs"]:
            st = config["steps"]
            step_ms = [s["step"] for s in st]
            lines.append(f"  bucket {config['bucket_mb']:g} MB, rank {r['rank']}: step {statistics.median(step_ms):.2f} ms median "
                         f"(range {min(step_ms):.2f}-{max(step_ms):.2f}); "
                         + (", ".join(f"{k} {statistics.median(s[k] for s in st):.2f}" for k in ("forward", "backward", "optimizer")
                                      if k in st[0]) or "free-running: no phase times"))
    return lines


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, rank, world, device = setup(args)
    import torch.distributed as dist

    if args.comm_hook == "bf16" and not device.startswith("cuda"):
        dist.destroy_process_group()
        raise GpuprofError("--comm-hook bf16 needs NCCL on CUDA GPUs; this run uses gloo on the CPU.",
                           "Use --comm-hook fp16 here, or run on GPUs.")

    try:
        if rank == 0:
            where = placement(torch, world, device)
            print(f"ddp_training: {args.depth} layers of {args.width}, batch {args.batch_size} per rank, "
                  f"buckets {', '.join(f'{b:g}' for b in args.bucket_mb)} MB, accumulate {args.accumulate}"
                  f"{', bf16' if args.bf16 else ''}{knobs(args)}, on {where} ({dist.get_backend()})", flush=True)
            if world == 1:
                print("  one process: DDP has no other rank to all-reduce with, so communication is not exercised "
                      "(start it with torchrun --nproc-per-node N)", flush=True)
        with annotate(f"rank_{rank}"):
            configs = []
            for bucket in args.bucket_mb:
                configs.append(train(args, torch, rank, device, bucket))
                if rank == 0:
                    print(f"  bucket {bucket:g} MB: {args.warmup} + {args.steps} steps done", flush=True)
        result = {"rank": rank, "configs": configs}
        results: list[Any] = [None] * world
        dist.all_gather_object(results, result)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    print("\n".join(summary_lines(results)))
    grad = gradient_bytes(args)
    if args.no_sync:
        print(f"--no-sync: no gradient was all-reduced, so the ranks' weights are not compared; "
              f"{grad / 2**20:.3g} MiB of gradients per optimizer step stayed on their GPUs")
    else:
        if not all(c["weights_identical_across_ranks"] for r in results for c in r["configs"]):
            raise GpuprofError("the ranks' weights differ after training: the gradients were not averaged alike.")
        print(f"result checked: the weights are identical on all {world} rank(s) after {args.warmup + args.steps} steps "
              f"per bucket size; {grad / 2**20:.3g} MiB of gradients per optimizer step")
    if args.torch_trace is not None:
        from gpuprof.cli import shown_path

        print(f"torch.profiler traces: {', '.join(shown_path(trace_file(args.torch_trace, r)) for r in range(world))}")
    if args.json:
        from gpuprof.kernels import write_json

        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"}
        write_json(args.json, {"config": config, "world_size": world, "device": device.split(":")[0],
                               "backend": "nccl" if device.startswith("cuda") else "gloo",
                               "gradient_bytes": grad, "ranks": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
