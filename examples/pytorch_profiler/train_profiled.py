#!/usr/bin/env python3
"""Profile a small CNN's training steps with torch.profiler: a schedule, options, a trace and its tables.

Trains a small CNN (gpuprof.models.small_cnn) on random CIFAR-sized images, one
``prof.step()`` per training step, under ``torch.profiler.profile`` with the schedule and
options given. Every time the schedule completes a cycle, the profiler hands it to
``on_trace_ready``, which here writes the trace (Kineto JSON; gzipped when the name ends in
.gz), writes the ``key_averages()`` records beside it (FILE.key_averages.json; with
--record-shapes also FILE.by_shape.key_averages.json, from
``key_averages(group_by_input_shape=True)``), and prints
the table sorted by self device time (self CPU time without a GPU). The trace is then read
back with gpuprof.torch_profiler and its ProfilerStep#N ranges are checked against the
steps the schedule says it recorded.

Each training step is wrapped in record_function ranges forward / backward /
optimizer_step. Without a GPU the profiler records CPU operators only, and the script
says so.

Examples:
  python examples/pytorch_profiler/train_profiled.py --trace train.json.gz
  python examples/pytorch_profiler/train_profiled.py --with-stack --record-shapes --trace stack.json.gz
  python examples/pytorch_profiler/train_profiled.py --wait 1 --warmup 1 --active 2 --repeat 2 --trace cycle.json.gz
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int, shown_path  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_argument_group("schedule (torch.profiler.schedule)")
    s.add_argument("--skip-first", type=nonnegative_int, default=0, help="steps ignored before the first cycle (default: 0)")
    s.add_argument("--wait", type=nonnegative_int, default=1, help="idle steps at the start of each cycle (default: 1)")
    s.add_argument("--warmup", type=nonnegative_int, default=1,
                   help="steps traced but discarded, at the start of each cycle's recording (default: 1)")
    s.add_argument("--active", type=positive_int, default=3, help="steps recorded in each cycle (default: 3)")
    s.add_argument("--repeat", type=positive_int, default=1, help="cycles (default: 1; each writes a trace)")
    o = p.add_argument_group("what the profiler records")
    for name in OPTIONS:
        o.add_argument("--" + name.replace("_", "-"), action="store_true", help=f"profile(..., {name}=True)")
    p.add_argument("--batch", type=positive_int, default=64, help="images per step (default: 64)")
    p.add_argument("--extra-steps", type=nonnegative_int, default=1,
                   help="steps after the last cycle, not profiled (default: 1)")
    p.add_argument("--trace", type=output_file, default=Path("train_profiled.json.gz"), metavar="FILE",
                   help="where the trace goes; with --repeat > 1, FILE gets .cycleN before its suffix "
                        "(default: train_profiled.json.gz)")
    p.add_argument("--rows", type=positive_int, default=12, help="rows of the key_averages table printed (default: 12)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the run (options, step times, files written) to FILE")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    return p.parse_args(argv)


def trace_path(base: Path, cycle: int, cycles: int) -> Path:
    """FILE for one cycle, FILE.cycleN.json(.gz) for several."""
    if cycles == 1:
        return base
    name = base.name
    stem, suffix = (name[:-8], ".json.gz") if name.endswith(".json.gz") else (base.stem, base.suffix or ".json")
    return base.with_name(f"{stem}.cycle{cycle}{suffix}")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("train_profiled.py")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    from gpuprof.models import check_loss_fell, require_training_memory, small_cnn, synthetic_batch, train_step
    from gpuprof.torch_profiler import key_averages as tk
    from gpuprof.torch_profiler import schedule as tsched
    from gpuprof.torch_profiler import trace as tt

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    sched = schedule(skip_first=args.skip_first, wait=args.wait, warmup=args.warmup, active=args.active, repeat=args.repeat)
    steps = args.skip_first + args.repeat * (args.wait + args.warmup + args.active) + args.extra_steps
    plan = tsched.actions(sched, steps)
    options = {name: getattr(args, name) for name in OPTIONS}
    chosen = ", ".join(k for k, v in options.items() if v) or "none"
    print(f"train_profiled: {steps} steps of batch {args.batch} on {device}; schedule skip_first={args.skip_first} "
          f"wait={args.wait} warmup={args.warmup} active={args.active} repeat={args.repeat}; options: {chosen}")
    if device == "cpu":
        print("  no GPU here (or --cpu): the profiler records CPU operators only, no kernels")

    torch.manual_seed(0)
    require_training_memory(small_cnn, (3, 32, 32), args.batch, device, "--batch", optimizer_states=1)  # SGD, momentum
    model = small_cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = synthetic_batch(args.batch, device)
    sort_key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    written: list[dict] = []

    def on_ready(prof) -> None:  # type: ignore[no-untyped-def]
        cycle = len(written)
        path = trace_path(args.trace, cycle, args.repeat)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        averages = prof.key_averages()
        records = tk.save_records(path.with_name(path.name.split(".json")[0] + ".key_averages.json"), averages,
                                  device=device, options=options, cycle=cycle)
        entry = {"trace": str(path), "key_averages": str(records), "bytes": path.stat().st_size}
        if options.get("record_shapes"):  # the same rows split by the shapes of their inputs
            entry["by_shape"] = str(tk.save_records(path.with_name(path.name.split(".json")[0] + ".by_shape.key_averages.json"),
                                                    prof.key_averages(group_by_input_shape=True), device=device,
                                                    options=options, cycle=cycle, group_by_input_shape=True))
        written.append(entry)
        print(f"  cycle {cycle}: trace {shown_path(path)} ({path.stat().st_size / 1e6:.2f} MB), "
              f"key_averages records {records.name}")
        print(averages.table(sort_by=sort_key, row_limit=args.rows))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    losses, step_ms = [], []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=".*warmup.*")  # warmup=0 is allowed; the chapter explains the cost
        with profile(activities=activities, schedule=sched, on_trace_ready=on_ready, **options) as prof:
            for _ in range(steps):
                t0 = time.perf_counter()
                loss = train_step(model, opt, x, y, annotate=record_function)
                losses.append(float(loss.item()))  # reads the loss back: the step's GPU work is finished
                step_ms.append((time.perf_counter() - t0) * 1e3)
                prof.step()
    # What PyTorch warned about (the events a cycle keeps, say), once each, without the file and line of
    # the installed PyTorch that raised it.
    for message in dict.fromkeys(" ".join(str(w.message).split()) for w in said):
        print(f"  PyTorch warned: {message}")
    print(check_loss_fell(losses))

    recorded = plan.loc[plan["recorded"], ["step", "cycle"]]
    for cycle, w in enumerate(written):
        trace = tt.read_trace(w["trace"])
        want = recorded.loc[recorded["cycle"] == cycle, "step"].tolist()
        got = trace.steps()["step"].tolist()
        if got != want:
            raise GpuprofError(f"cycle {cycle}: the trace holds ProfilerStep#{got}, the schedule recorded steps {want}.")
        print(f"trace checked: cycle {cycle} holds steps {got}, as the schedule says; {trace.describe()}")
    if len(written) != args.repeat:
        raise GpuprofError(f"{len(written)} trace(s) written for {args.repeat} cycle(s).")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"device": device, "torch": torch.__version__, "batch": args.batch,
                               "schedule": {"skip_first": args.skip_first, "wait": args.wait, "warmup": args.warmup,
                                            "active": args.active, "repeat": args.repeat},
                               "options": options, "plan": plan.to_dict(orient="records"), "step_ms": step_ms,
                               "loss": losses, "written": written})
    return 0


if __name__ == "__main__":
    sys.exit(main())
