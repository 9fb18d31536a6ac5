#!/usr/bin/env python3
"""What the PyTorch profiler costs: a training step's time under each option, against no profiler.

Runs the same training steps (gpuprof.models.small_cnn, random CIFAR-sized images) with no
profiler, then under ``torch.profiler.profile`` with CPU (and, on a GPU, CUDA) activities
and no options, then with each option alone (record_shapes, profile_memory, with_stack,
with_flops, with_modules), then with all of them. Every configuration records --steps
steps after one warm-up step; the rounds are interleaved (--rounds), so that a drift of
the machine (clocks, caches) spreads over all configurations alike.

For each configuration it reports the median step time and its ratio to no profiler,
the added time per operator (the step's extra time over the CPU operators a step runs),
the time the profiler takes after the last step to process and export the trace, the
trace's size, and what the option added: events and arguments in the trace (read back
with gpuprof.torch_profiler), and rows of key_averages() with FLOP counts.

Each step ends by reading the loss back (``loss.item()``), so a step's time is its latency
with the GPU drained at its end, the host never running ahead into the next step.

--also adds configurations of several options together (``--also with_stack+profile_memory``),
to find which ones cost more together than the sum of their prices alone.

Runs on a CPU too (CPU activities only). Example:
  python examples/pytorch_profiler/profiler_overhead.py --json overhead.json
  python examples/pytorch_profiler/profiler_overhead.py --also record_shapes+with_stack --also with_stack+profile_memory
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
CONFIGS = {"no profiler": None, "profiler, no options": {}, **{o: {o: True} for o in OPTIONS},
           "all options": {o: True for o in OPTIONS}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=20, help="recorded steps per configuration and round (default: 20)")
    p.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds over all configurations (default: 3)")
    p.add_argument("--batch", type=positive_int, default=64, help="images per step (default: 64)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE")
    p.add_argument("--also", action="append", default=[], type=option_set, metavar="OPT+OPT",
                   help=f"another configuration: options joined by + (any of {', '.join(OPTIONS)}); may be repeated")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    return p.parse_args(argv)


def option_set(text: str) -> tuple[str, ...]:
    """argparse type: options joined by '+', each one of OPTIONS."""
    names = tuple(n.strip() for n in text.split("+") if n.strip())
    bad = [n for n in names if n not in OPTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{bad[0] if bad else text!r} is not an option; the options are {', '.join(OPTIONS)}")
    return names


def configurations(also: list[tuple[str, ...]]) -> dict[str, dict[str, bool] | None]:
    """The standard configurations, then each --also set (named by its options joined by '+')."""
    return {**CONFIGS, **{"+".join(names): {n: True for n in names} for names in also}}


def trace_contents(path: Path) -> dict:
    """What a trace holds: events by kind, and the arguments the options add."""
    from gpuprof.torch_profiler import trace as tt

    t = tt.read_trace(path)
    ops = t.cpu_ops()
    kinds = {k: len(t.events(k)) for k in ("cpu_op", "user_annotation", "python_function", "runtime", "kernel",
                                           "memcpy", "memset")}
    kinds["memory"] = len(t.memory_events())
    args = {a: int(ops[a].notna().sum()) if a in ops else 0 for a in ("Input Dims", "flops")}
    return {"bytes": path.stat().st_size, "events": kinds, "args": args, "steps": len(t.steps())}


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = configurations(args.also)
    torch = require_torch("profiler_overhead.py")
    from torch.profiler import ProfilerActivity, profile, schedule
    from gpuprof.models import check_loss_fell, require_training_memory, small_cnn, synthetic_batch, train_step

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    print(f"profiler_overhead: {len(configs)} configurations x {args.rounds} rounds x {args.steps} steps of batch "
          f"{args.batch} on {device}" + ("" if device == "cuda" else " (CPU activities only)"), flush=True)
    torch.manual_seed(0)
    require_training_memory(small_cnn, (3, 32, 32), args.batch, device, "--batch", optimizer_states=1)  # SGD, momentum
    model = small_cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = synthetic_batch(args.batch, device)
    losses: list[float] = []

    def step() -> float:
        t0 = time.perf_counter()
        loss = train_step(model, opt, x, y)
        losses.append(float(loss.item()))  # reads the loss back: the step's GPU work is finished
        return time.perf_counter() - t0

    for _ in range(3):  # the first steps pay one-time costs (cuDNN plans, allocator growth)
        step()
    times: dict[str, list[float]] = {name: [] for name in configs}
    post: dict[str, list[float]] = {name: [] for name in configs}
    contents: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's notes about warm-up and cycles are not findings here
        for r in range(args.rounds):
            for name, options in configs.items():
                if options is None:
                    times[name] += [step() for _ in range(args.steps)]
                    continue
                path = Path(tmp) / f"{len(contents)}.json"
                done: dict[str, float] = {}

                def ready(prof, path=path, done=done) -> None:  # type: ignore[no-untyped-def]
                    prof.export_chrome_trace(str(path))
                    done["t"] = time.perf_counter()
                    done["flops_rows"] = sum(1 for e in prof.key_averages() if getattr(e, "flops", 0))

                with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=args.steps, repeat=1),
                             on_trace_ready=ready, **options) as prof:
                    step()
                    prof.step()
                    for i in range(args.steps):
                        times[name].append(step())
                        t_last = time.perf_counter()
                        prof.step()
                if "t" not in done:
                    raise GpuprofError(f"{name}: the profiler handed no trace to on_trace_ready.")
                post[name].append(done["t"] - t_last)
                if r == 0:
                    contents[name] = {**trace_contents(path), "key_averages_rows_with_flops": done["flops_rows"]}
            print(f"  round {r + 1} of {args.rounds} done", flush=True)
    print(check_loss_fell(losses))

    base = statistics.median(times["no profiler"])
    ops_per_step = contents["profiler, no options"]["events"]["cpu_op"] / args.steps
    rows = []
    width = max(22, *(len(n) + 2 for n in configs))
    print(f"\n{'configuration':<{width}}{'step ms':>9}{'spread':>8}{'vs none':>9}{'us/op':>8}{'export s':>10}{'trace MB':>10}")
    for name in configs:
        med = statistics.median(times[name])
        q = statistics.quantiles(times[name], n=4) if len(times[name]) > 1 else [med, med, med]
        c = contents.get(name)
        added_us = (med - base) / ops_per_step * 1e6 if name != "no profiler" else 0.0
        row = {"configuration": name, "median_ms": med * 1e3, "iqr_ms": (q[2] - q[0]) * 1e3, "ratio": med / base,
               "added_us_per_op": added_us, "export_s": statistics.median(post[name]) if post[name] else 0.0,
               "trace": c}
        rows.append(row)
        print(f"{name:<{width}}{med * 1e3:>9.2f}{row['iqr_ms']:>8.2f}{row['ratio']:>8.2f}x{added_us:>8.1f}"
              f"{row['export_s']:>10.2f}{(c['bytes'] / 1e6 if c else 0):>10.2f}")
    print(f"\n{ops_per_step:.0f} CPU operators per step; median of {args.rounds * args.steps} steps each, "
          "spread = interquartile range")
    print("\nwhat each option adds (events in the trace; operators with shapes or FLOP counts in the trace; "
          "key_averages rows with FLOP counts):")
    for name, c in contents.items():
        ev = ", ".join(f"{v:,} {k}" for k, v in c["events"].items() if v)
        print(f"  {name:<{width}}{ev}; shapes on {c['args']['Input Dims']:,} ops, flops on {c['args']['flops']:,}; "
              f"key_averages flops rows {c['key_averages_rows_with_flops']}")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"torch": torch.__version__, "device": device, "steps": args.steps, "rounds": args.rounds,
                               "batch": args.batch, "ops_per_step": ops_per_step, "rows": rows, "step_seconds": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
