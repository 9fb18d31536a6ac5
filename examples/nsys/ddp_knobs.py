#!/usr/bin/env python3
"""Time DDP's knobs side by side in one job: which of them shortens a step, and what does DDP cost?

Every variant trains ``ddp_training.py``'s model (the same initial weights, the same data,
one bucket size) under a fresh DistributedDataParallel wrapper with its own settings. A
variant is a precision and the knobs turned on, joined by ``+``:

  precision     fp32 (as ddp_training.py runs by default) or bf16 (autocast; gradients stay FP32)
  nosync        every backward under no_sync(): the step without any all-reduce. A variant's
                step minus its precision's nosync step is what gradient synchronisation
                costs it, waiting and transfer together, with no profiler involved
  bucket-view   DDP(gradient_as_bucket_view=True)
  static-graph  DDP(static_graph=True)
  find-unused   DDP(find_unused_parameters=True)
  default-buckets  bucket_cap_mb left unset: DDP's real default, its first bucket capped at 1 MiB
                (with --bucket-mb 25 only, the size that default uses)
  bf16-hook     bf16_compress_hook (NCCL only); fp16-hook: fp16_compress_hook

The variants run in turn, --rounds times, in the same processes (each round starts one
variant later, so no variant always follows the same one); a variant's step is the slower
rank's, its time the median over its rounds' steps, and the range of its rounds' medians
shows the noise within the job. Noise between jobs is larger: run the script several times
and compare (chapter 8 runs it three times).

Examples:
  torchrun --standalone --nproc-per-node 2 examples/nsys/ddp_knobs.py --bucket-mb 100
  torchrun --standalone --nproc-per-node 2 examples/nsys/ddp_knobs.py --variants fp32,fp32+nosync,bf16,bf16+nosync

Default variants: on GPUs, fp32 and bf16 each alone, without sync and with the bf16 hook, fp32
with each DDP knob alone, and bf16 with all of them; on the CPU (gloo, which has no bf16
all-reduce) the fp16 hook stands in for the bf16 one.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo
sys.path.insert(0, str(Path(__file__).resolve().parent))  # ddp_training.py, beside this file

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import output_file, positive_float, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

import ddp_training  # noqa: E402

PRECISIONS = ("fp32", "bf16")
KNOBS = {"nosync": {"no_sync": True}, "bucket-view": {"grad_as_bucket_view": True},
         "static-graph": {"static_graph": True}, "find-unused": {"find_unused_parameters": True},
         "bf16-hook": {"comm_hook": "bf16"}, "fp16-hook": {"comm_hook": "fp16"},
         "default-buckets": {"default_buckets": True}}
GPU_VARIANTS = ["fp32", "fp32+nosync", "fp32+bucket-view", "fp32+static-graph", "fp32+find-unused", "fp32+bf16-hook",
                "bf16", "bf16+nosync", "bf16+bf16-hook", "bf16+bf16-hook+bucket-view+static-graph"]
CPU_VARIANTS = [v.replace("bf16-hook", "fp16-hook") for v in GPU_VARIANTS]


def variant_settings(name: str) -> dict[str, Any]:
    """ddp_training's options for one variant name (``bf16+bucket-view``); ValueError says what is wrong."""
    precision, *knobs = name.split("+")
    if precision not in PRECISIONS:
        raise ValueError(f"a variant starts with its precision ({' or '.join(PRECISIONS)}), got {name!r}")
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        raise ValueError(f"unknown knob {unknown[0]!r} in {name!r}; knobs: {', '.join(KNOBS)}")
    if len(set(knobs)) != len(knobs) or ("bf16-hook" in knobs and "fp16-hook" in knobs):
        raise ValueError(f"{name!r} repeats a knob or asks for two hooks")
    settings: dict[str, Any] = {"bf16": precision == "bf16"}
    for knob in knobs:
        settings.update(KNOBS[knob])
    return settings


def variant_list(text: str) -> list[str]:
    """argparse type: variant names separated by commas."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one variant")
    for name in names:
        try:
            variant_settings(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a variant is named twice in {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=variant_list, default=None, metavar="V[,V...]",
                   help="the variants to time (default: see below)")
    p.add_argument("--bucket-mb", type=positive_float, default=25.0, help="DDP bucket_cap_mb for every variant (default: 25)")
    p.add_argument("--rounds", type=positive_int, default=2, help="times every variant runs (default: 2)")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps per variant and round (default: 3)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per variant and round (default: 10)")
    p.add_argument("--width", type=positive_int, default=None, help="features of every layer (ddp_training.py's default)")
    p.add_argument("--depth", type=positive_int, default=None, help="linear layers (ddp_training.py's default)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="samples per step per rank (ddp_training.py's default)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo) even where GPUs are available")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="rank 0 writes the configuration and every rank's step times to FILE")
    args = p.parse_args(argv)
    if args.bucket_mb != ddp_training.DDP_DEFAULT_BUCKET_MB and any("default-buckets" in v for v in args.variants or []):
        p.error(f"the default-buckets variants are DDP's own {ddp_training.DDP_DEFAULT_BUCKET_MB:g} MB default: "
                f"give --bucket-mb {ddp_training.DDP_DEFAULT_BUCKET_MB:g}, not {args.bucket_mb:g}")
    return args


def base_options(args: argparse.Namespace) -> argparse.Namespace:
    """ddp_training's options shared by every variant (its defaults for what this script leaves out)."""
    argv = ["--bucket-mb", f"{args.bucket_mb:g}", "--warmup", str(args.warmup), "--steps", str(args.steps)]
    for flag, value in (("--width", args.width), ("--depth", args.depth), ("--batch-size", args.batch_size)):
        argv += [flag, str(value)] if value is not None else []
    return ddp_training.parse_args(argv + (["--cpu"] if args.cpu else []))


def rotated(names: list[str], by: int) -> list[str]:
    """The variants in round ``by``'s order: the list started ``by`` places later."""
    k = by % len(names)
    return names[k:] + names[:k]


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = base_options(args)
    torch, rank, world, device = ddp_training.setup(base)
    import torch.distributed as dist

    gpu = device.startswith("cuda")
    variants = args.variants or (GPU_VARIANTS if gpu else CPU_VARIANTS)
    try:
        if not gpu and any("bf16-hook" in v for v in variants):
            raise GpuprofError("the bf16-hook variants need NCCL on CUDA GPUs; this run uses gloo on the CPU.",
                               "Use fp16-hook here, or run on GPUs.")
        if rank == 0:
            where = ddp_training.placement(torch, world, device)
            print(f"ddp_knobs: {len(variants)} variants x {args.rounds} rounds of {args.warmup} + {args.steps} steps, "
                  f"{base.depth} layers of {base.width}, batch {base.batch_size} per rank, buckets {args.bucket_mb:g} MB, "
                  f"on {where} ({dist.get_backend()})", flush=True)
            if world == 1:
                print("  one process: no other rank to all-reduce with, so the knobs have no communication to act on "
                      "(start it with torchrun --nproc-per-node N)", flush=True)
        template = ddp_training.build_model(base, torch, device)
        runs = []
        with annotate(f"rank_{rank}"):
            for r in range(args.rounds):
                for name in rotated(variants, r):
                    options = argparse.Namespace(**{**vars(base), **variant_settings(name)})
                    with annotate(f"variant_{name}"):
                        out = ddp_training.train(options, torch, rank, device, args.bucket_mb, model=copy.deepcopy(template))
                    runs.append({"variant": name, "round": r, "steps": out["steps"], "buckets": out["buckets"],
                                 "weights_identical_across_ranks": out["weights_identical_across_ranks"]})
                if rank == 0:
                    print(f"  round {r + 1}/{args.rounds} done", flush=True)
        results: list[Any] = [None] * world
        dist.all_gather_object(results, {"rank": rank, "runs": runs})
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    synced = [run for res in results for run in res["runs"] if not variant_settings(run["variant"]).get("no_sync")]
    if not all(run["weights_identical_across_ranks"] for run in synced):
        raise GpuprofError("the ranks' weights differ after a synchronised variant: the gradients were not averaged alike.")
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "variants")} | {"variants": variants},
              "world_size": world, "device": device.split(":")[0], "backend": "nccl" if gpu else "gloo",
              "gradient_bytes": ddp_training.gradient_bytes(base), "ranks": results,
              # NCCL reads its settings (NCCL_MAX_NCHANNELS, NCCL_ALGO, ...) from the environment: keep them with the times
              "nccl_environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}}
    from gpuprof.studies.multi_gpu import knob_table

    print(knob_table([result]).round(3).to_string())
    print(f"result checked: after every variant that all-reduces, the weights are identical on all {world} rank(s)")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
