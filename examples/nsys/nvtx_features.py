#!/usr/bin/env python3
"""Every NVTX feature the course teaches, one section each, for one Nsight Systems capture.

Sections (all by default, or pick with --sections):

  basics    nvtx.annotate as a decorator and a context manager; colours, payloads, categories
  domains   ranges in a domain of their own ("course"), with push_range/pop_range
  threads   a start_range on the main thread ended with end_range on a worker thread
  marks     instantaneous nvtx.mark events
  nested    ranges three levels deep
  training  a small MLP trained with the warmup / step_N / forward_pass / backward_pass /
            optimizer_step ranges (torch.cuda.nvtx is used for one range, to show it too);
            --emit-nvtx adds PyTorch's own per-operator ranges (torch.autograd.profiler.emit_nvtx)
  auto      nvtx.Profile: every Python function call becomes a range, automatically
  cost      nanoseconds per range, for each way of making one (prints "cost: NAME X ns")

  nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none -o nvtx python examples/nsys/nvtx_features.py

Needs the `nvtx` package (pip install nvtx); runs without a GPU (the training section
then runs on the CPU, and the ranges are recorded only when a profiler is attached).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import choose_backend, exit_on_error  # noqa: E402
from gpuprof.cli import add_sections_argument, bounded_int, positive_int, resolve_sections  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

SECTIONS = ("basics", "domains", "threads", "marks", "nested", "training", "auto", "cost")
MAX_COST_CALLS = 10_000_000

try:
    import nvtx
except ImportError:  # the message is given in main(), as one sentence
    nvtx = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sections_argument(p, SECTIONS)
    p.add_argument("--steps", type=positive_int, default=5, help="measured training steps after 2 warm-up steps (default: 5)")
    p.add_argument("--emit-nvtx", action="store_true", help="wrap training in torch.autograd.profiler.emit_nvtx()")
    p.add_argument("--cost-calls", type=bounded_int(MAX_COST_CALLS, "at up to a few microseconds a range under a "
                                                                    "profiler, ten million already take minutes"),
                   default=100_000, help=f"ranges per cost measurement (default: 100000; at most {MAX_COST_CALLS:,})")
    p.add_argument("--backend", choices=["torch", "cpu"], default=None, help="force a backend for training")
    args = p.parse_args(argv)
    args.sections = resolve_sections(p, args.sections, SECTIONS)
    return args


# -- basics -----------------------------------------------------------------------------

@nvtx.annotate("load_batch", color="blue", category="io") if nvtx else (lambda f: f)
def load_batch(n: int) -> list[int]:
    """A decorated function: every call is one range named load_batch, in the 'io' category."""
    time.sleep(0.001)
    return list(range(n))


def basics() -> None:
    for i in range(3):
        batch = load_batch(1000)
        with nvtx.annotate("process_batch", color="green", payload=i):  # the payload shows as the range's value
            sum(x * x for x in batch)


def domains() -> None:
    """A library's ranges in their own domain, so they can be shown or hidden as a group."""
    course = nvtx.get_domain("course")
    for i in range(3):
        course.push_range(message=f"library_call_{i}", color="purple")
        time.sleep(0.001)
        course.pop_range()


def threads() -> None:
    """start_range/end_range are not tied to a thread: this range starts here and ends in a worker."""
    handle = nvtx.start_range("handed_to_worker", color="orange")

    def worker() -> None:
        time.sleep(0.002)
        nvtx.end_range(handle)

    t = threading.Thread(target=worker, name="worker")
    t.start()
    t.join()


def marks() -> None:
    for what in ("checkpoint_saved", "lr_changed"):
        nvtx.mark(what, color="red")
        time.sleep(0.0005)


def nested() -> None:
    with nvtx.annotate("epoch"):
        for b in range(2):
            with nvtx.annotate(f"batch_{b}"):
                with nvtx.annotate("inner_work"):
                    time.sleep(0.0005)


# -- training ---------------------------------------------------------------------------

def training(steps: int, emit: bool, backend_choice: str | None) -> None:
    import contextlib

    backend = choose_backend(backend_choice)
    if backend.name != "torch":
        print("  (training needs PyTorch; skipped)")
        return
    torch = backend.xp
    dev = backend.device
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=dev)
    y = torch.randn(256, 1024, device=dev)
    if emit and not backend.is_gpu:
        print("  (--emit-nvtx needs a CUDA build of PyTorch and a GPU: training runs without PyTorch's ranges)")
        emit = False
    ctx = torch.autograd.profiler.emit_nvtx() if emit else contextlib.nullcontext()
    losses = []
    with ctx:
        for step in range(2 + steps):
            name = "warmup" if step < 2 else f"step_{step - 2}"
            with nvtx.annotate(name, color="gray" if step < 2 else "green"):
                with nvtx.annotate("forward_pass"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with nvtx.annotate("backward_pass"):
                    loss.backward()
                if backend.is_gpu:
                    torch.cuda.nvtx.range_push("optimizer_step")  # PyTorch's own NVTX binding
                opt.step()
                opt.zero_grad(set_to_none=True)
                if backend.is_gpu:
                    torch.cuda.nvtx.range_pop()
                losses.append(loss.item())  # a synchronisation point, inside the step's range
    if not losses[-1] < losses[0]:
        raise GpuprofError(f"training did not reduce the loss ({losses[0]:.4f} -> {losses[-1]:.4f})")
    print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")


# -- automatic annotation and cost --------------------------------------------------------

def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def auto() -> None:
    """nvtx.Profile turns every Python call into a range: useful to explore, costly to keep.

    The added cost per call is the difference of two medians; it is printed with the
    noise of the measurement (the interquartile ranges of both sets of runs, per call), and
    a difference smaller than the noise is reported as such rather than as a cost.
    """
    def times(runs: int = 9) -> list[float]:
        samples = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fib(18)
            samples.append(time.perf_counter() - t0)
        return samples

    def iqr(xs: list[float]) -> float:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return q[2] - q[0]

    plain = times()
    pr = nvtx.Profile()
    pr.enable()
    annotated = times()
    pr.disable()
    calls = 2 * fib(19) - 1  # calls made by fib(18)
    p_med, a_med = statistics.median(plain), statistics.median(annotated)
    # rounded as printed, so the verdict agrees with the two numbers the reader sees
    added = round((a_med - p_med) / calls * 1e9, 1)
    noise = round((iqr(plain) + iqr(annotated)) / calls * 1e9, 1)
    verdict = "within noise" if abs(added) <= noise else f"{a_med / p_med:.2f}x"
    print(f"  fib(18), median of 9: {calls} calls, {p_med * 1e3:.2f} ms plain, {a_med * 1e3:.2f} ms under nvtx.Profile ({verdict})")
    print(f"  auto: {added:.1f} ns added per call (noise {noise:.1f} ns)")


def cost(calls: int) -> None:
    """Median nanoseconds per range (open + close) for each API, over 5 batches of ``calls``."""
    course = nvtx.get_domain("course")
    attrs = course.get_event_attributes(message="cost_probe")  # built once, reused: the cheapest way
    variants = {
        "annotate_context_manager": lambda: nvtx.annotate("cost_probe").__enter__().__exit__(None, None, None),
        "push_pop_range": lambda: (nvtx.push_range("cost_probe"), nvtx.pop_range()),
        "domain_push_pop": lambda: (course.push_range(attrs), course.pop_range()),
        "mark": lambda: nvtx.mark("cost_probe"),
    }
    try:
        import torch

        variants["torch_cuda_nvtx"] = lambda: (torch.cuda.nvtx.range_push("cost_probe"), torch.cuda.nvtx.range_pop())
        torch.cuda.nvtx.range_push("probe")
        torch.cuda.nvtx.range_pop()
    except Exception:  # CPU builds of PyTorch have no torch.cuda.nvtx
        variants.pop("torch_cuda_nvtx", None)
    for name, fn in variants.items():
        samples = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter_ns() - t0) / calls)
        print(f"  cost: {name} {statistics.median(samples):.0f} ns")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if nvtx is None:
        raise GpuprofError("nvtx_features.py needs the nvtx package.", "Install it with `pip install nvtx`.")
    from importlib.metadata import version

    print(f"nvtx_features: nvtx {version('nvtx')}")
    for name in args.sections:
        print(f"[{name}]")
        if name == "training":
            training(args.steps, args.emit_nvtx, args.backend)
        elif name == "cost":
            cost(args.cost_calls)
        else:
            globals()[name]()
    print("result checked: every section ran" + (" and training reduced the loss" if "training" in args.sections else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
