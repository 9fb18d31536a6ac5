#!/usr/bin/env python3
"""Train a small CNN the way people first write the loop, with a flag for every lever that makes it faster.

The model is the two-convolution CNN of the PyTorch profiler chapter (Conv2d 3->64, ReLU,
MaxPool, Conv2d 64->128, ReLU, MaxPool, AdaptiveAvgPool, Linear 128->10; Adam), trained on
32 x 32 images generated once (gpuprof.cnn_data: a learnable task, no download) and
augmented per step as torchvision's CIFAR-10 recipe does. With no flags it is the naive
loop: a DataLoader in the main process making every image with PIL, pageable copies,
``loss.item()`` every step, FP32, eager PyTorch. Each flag turns one lever on:

  --workers N         DataLoader worker processes prepare the images (default 0: the main process)
  --pin-memory        DataLoader(pin_memory=True): batches land in page-locked memory
  --non-blocking      .to(device, non_blocking=True): the copy does not wait for the host
  --data-on-gpu       the whole image set lives on the GPU; batches are augmented there
  --loss-every N      read the loss back every N steps instead of every step
  --bf16              autocast to bfloat16
  --channels-last     NHWC memory format for the model and its inputs
  --cudnn-benchmark   torch.backends.cudnn.benchmark = True (time the algorithms, keep the fastest)
  --fused-adam        Adam(fused=True): one kernel for the whole update
  --compile MODE      torch.compile(model, mode=MODE): default or reduce-overhead
  --compile-scope S   what --compile compiles: model (the model alone; default) or step (the model with its
                      loss, and Adam's step, as the CUDA graph of --cuda-graphs holds them)
  --cuda-graphs       capture the whole step (forward, backward, Adam) in one CUDA graph, replay it; Adam is
                      made capturable (capturable=True, which the foreach and the fused Adam both support)

Each step is in NVTX ranges (warmup, step_N; inside them data_wait, h2d, forward, backward,
optimizer, loss_read) for Nsight Systems. Warm-up steps are timed one by one (they hold
torch.compile's compilation and cuDNN's autotuning); then ``--repeats`` windows of
``--steps`` steps are timed with the host's clock, synchronised at both ends: images per
second is what the loop delivers, data preparation included. ``--profile-steps K`` then
runs K more steps between cudaProfilerStart and cudaProfilerStop, for
``nsys profile --capture-range=cudaProfilerApi``. Every step's loss is kept; a run of 20
steps or more fails if training did not work (the last steps' mean loss must be below the
first steps'; shorter runs are too short to tell and say so).

Without a GPU it runs on the CPU and says which levers have nothing to act on there.

Examples:
  python examples/nsys/cnn_training.py                         # the naive loop
  python examples/nsys/cnn_training.py --workers 8 --pin-memory --non-blocking --loss-every 50
  python examples/nsys/cnn_training.py --data-on-gpu --loss-every 50 --cuda-graphs --batch-size 1024 --bf16 --channels-last
  nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o naive \\
      python examples/nsys/cnn_training.py --repeats 1 --profile-steps 10
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import nonnegative_int, output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

COMPILE_MODES = ("off", "default", "reduce-overhead")
COMPILE_SCOPES = ("model", "step")
# Levers that only act on a GPU: on the CPU they are accepted and reported as idle.
GPU_ONLY = ("pin_memory", "non_blocking", "cudnn_benchmark", "cuda_graphs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    lev = p.add_argument_group("levers (all off by default: the naive loop)")
    lev.add_argument("--workers", type=nonnegative_int, default=0, help="DataLoader worker processes (default: 0)")
    lev.add_argument("--pin-memory", action="store_true", help="DataLoader(pin_memory=True)")
    lev.add_argument("--non-blocking", action="store_true", help="copy batches with non_blocking=True")
    lev.add_argument("--data-on-gpu", action="store_true", help="keep the image set on the GPU and augment batches there")
    lev.add_argument("--loss-every", type=positive_int, default=1, help="read the loss back every N steps (default: 1)")
    lev.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    lev.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    lev.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    lev.add_argument("--fused-adam", action="store_true", help="Adam(fused=True)")
    lev.add_argument("--compile", choices=COMPILE_MODES, default="off", help="torch.compile mode (default: off)")
    lev.add_argument("--compile-scope", choices=COMPILE_SCOPES, default="model",
                     help="what --compile compiles: the model alone, or the step (model and loss in one region, and "
                          "Adam's step) (default: model)")
    lev.add_argument("--cuda-graphs", action="store_true", help="capture the whole training step in a CUDA graph")
    run = p.add_argument_group("the run")
    run.add_argument("--batch-size", type=positive_int, default=32, help="images per step (default: 32)")
    run.add_argument("--warmup", type=positive_int, default=10, help="untimed steps first (default: 10; at least 3 "
                                                                     "with --cuda-graphs, which warms up on a side stream)")
    run.add_argument("--steps", type=positive_int, default=100, help="steps per timed window (default: 100)")
    run.add_argument("--min-window-s", type=float, default=0.0, metavar="S",
                     help="go on past --steps until a window has lasted S seconds (default: 0): fast and slow "
                          "configurations then get windows of similar length")
    run.add_argument("--repeats", type=positive_int, default=3, help="timed windows (default: 3)")
    run.add_argument("--profile-steps", type=nonnegative_int, default=0,
                     help="steps run after the windows between cudaProfilerStart/Stop (default: 0)")
    run.add_argument("--dataset-size", type=positive_int, default=20000, help="images generated (default: 20000)")
    run.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default: 0.001)")
    run.add_argument("--seed", type=nonnegative_int, default=0, help="seed for the data and the weights (default: 0)")
    run.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the configuration and results to FILE")
    run.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    args = p.parse_args(argv)
    if args.cuda_graphs and args.compile != "off":
        p.error("--cuda-graphs and --compile do not combine here: --compile reduce-overhead is torch.compile's own "
                "use of CUDA graphs")
    if args.data_on_gpu and (args.workers or args.pin_memory):
        p.error("--data-on-gpu replaces the DataLoader: --workers and --pin-memory have nothing to act on")
    if args.compile_scope != "model" and args.compile == "off":
        p.error("--compile-scope needs --compile default or --compile reduce-overhead")
    if args.min_window_s < 0:
        p.error(f"--min-window-s must not be negative, not {args.min_window_s}")
    if not args.lr > 0:
        p.error(f"--lr must be greater than 0, not {args.lr}")
    if args.cuda_graphs and args.warmup < 3:
        p.error("--cuda-graphs needs --warmup 3 or more (the steps before capture run on a side stream)")
    return args


def levers(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration as a dict: what --json records and what the chapter's tables are keyed on."""
    return {"workers": args.workers, "pin_memory": args.pin_memory, "non_blocking": args.non_blocking,
            "data_on_gpu": args.data_on_gpu, "loss_every": args.loss_every, "bf16": args.bf16,
            "channels_last": args.channels_last, "cudnn_benchmark": args.cudnn_benchmark,
            "fused_adam": args.fused_adam, "compile": args.compile, "compile_scope": args.compile_scope,
            "cuda_graphs": args.cuda_graphs,
            "batch_size": args.batch_size}


def batches(args: argparse.Namespace, device: str) -> Iterator[tuple[Any, Any]]:
    """Training batches, on the host (DataLoader) or already on the device (--data-on-gpu).

    The images are generated here, before the first batch is asked for, so that the first
    step's time holds the step and not the data set's creation.
    """
    import torch
    from gpuprof import cnn_data

    images, labels = cnn_data.make_images(args.dataset_size, seed=args.seed)
    if args.data_on_gpu:
        gimages, glabels = cnn_data.images_to_device(images, labels, device)
        gen = torch.Generator(device=device).manual_seed(args.seed)

        def on_device() -> Iterator[tuple[Any, Any]]:
            order = torch.empty(0, dtype=torch.long, device=device)
            while True:
                if order.numel() < args.batch_size:  # a new epoch: a fresh permutation, drawn on the device
                    order = torch.cat([order, torch.randperm(len(labels), device=device, generator=gen)])
                index, order = order[:args.batch_size], order[args.batch_size:]
                yield cnn_data.augment_batch(gimages, index, gen), glabels[index]

        return on_device()
    dataset = cnn_data.AugmentedImages(images, labels)
    # One pass of a sampler that draws a new permutation every epoch, for a million epochs
    # (lazily: endless in practice): no epoch boundary, where the workers' prefetching would drain.
    sampler = torch.utils.data.RandomSampler(dataset, num_samples=len(dataset) * 1_000_000,
                                             generator=torch.Generator().manual_seed(args.seed))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                                         num_workers=args.workers, pin_memory=args.pin_memory and device == "cuda",
                                         persistent_workers=args.workers > 0)
    return iter(loader)


class Trainer:
    """The model, its optimizer and one training step, built for the levers chosen."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        import torch
        from gpuprof.models import small_cnn

        self.args, self.device, self.torch = args, device, torch
        torch.manual_seed(args.seed)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        self.memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
        self.model = small_cnn().to(device, memory_format=self.memory_format)
        opt_kw: dict[str, Any] = {"lr": args.lr}
        if args.fused_adam:
            opt_kw["fused"] = True
        if args.cuda_graphs:
            # What a CUDA graph needs of Adam: its step count on the GPU, so that a replay advances it. The foreach
            # (default) and the fused implementation both have this path; --fused-adam is a lever of its own.
            opt_kw["capturable"] = True
        self.opt = torch.optim.Adam(self.model.parameters(), **opt_kw)
        self.forward_model: Callable[[Any], Any] = self.model
        self.loss_of: Callable[[Any, Any], Any] = self.model_loss
        self.opt_step: Callable[[], Any] = self.opt.step
        if args.compile != "off" and args.compile_scope == "model":
            self.forward_model = torch.compile(self.model, mode=args.compile)
        elif args.compile != "off":
            # The step the CUDA graph of --cuda-graphs holds: the model and its loss as one compiled region (its
            # backward compiled with it), and Adam's step compiled as PyTorch's recipe "Compiling the optimizer with
            # torch.compile" does it (its default mode: the optimizer's in-place updates of the parameters).
            self.loss_of = torch.compile(self.model_loss, mode=args.compile)
            self.opt_step = torch.compile(self.opt.step)
        self.graph: Any = None
        self.static: tuple[Any, Any, Any] | None = None

    def autocast(self) -> Any:
        if not self.args.bf16:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device, dtype=self.torch.bfloat16)

    def model_loss(self, x: Any, y: Any) -> Any:
        """The forward pass and its loss, under autocast with --bf16 (one region, for --compile-scope step)."""
        import torch.nn.functional as F

        with self.autocast():
            return F.cross_entropy(self.forward_model(x), y)

    def to_device(self, x: Any, y: Any) -> tuple[Any, Any]:
        non_blocking = self.args.non_blocking
        return (x.to(self.device, non_blocking=non_blocking, memory_format=self.memory_format),
                y.to(self.device, non_blocking=non_blocking))

    def place(self, x: Any, y: Any) -> tuple[Any, Any]:
        """A batch made ready for the step: copied to the device (host data), or put in channels_last (device data)."""
        if not self.args.data_on_gpu:
            with annotate("h2d"):
                return self.to_device(x, y)
        if self.args.channels_last:
            x = x.contiguous(memory_format=self.torch.channels_last)
        return x, y

    def eager_step(self, x: Any, y: Any) -> Any:
        """Forward, backward, Adam; returns the loss tensor (not read back)."""
        if self.args.compile == "reduce-overhead":
            self.torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be reused
        with annotate("forward"):
            loss = self.loss_of(x, y)
        with annotate("backward"):
            loss.backward()
        with annotate("optimizer"):
            self.opt_step()
            self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def warm_graph(self, x: Any, y: Any, steps: int) -> list[Any]:
        """--cuda-graphs: ``steps`` eager steps on a side stream (as PyTorch's docs require), then capture one."""
        torch = self.torch
        sx, sy = x.clone(), y.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        losses = []
        with torch.cuda.stream(side):
            for _ in range(steps):
                losses.append(self.eager_step(sx, sy))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        import torch.nn.functional as F

        with torch.cuda.graph(self.graph):
            with self.autocast():
                static_loss = F.cross_entropy(self.model(sx), sy)
            static_loss.backward()
            self.opt.step()
        self.static = (sx, sy, static_loss)
        return losses

    def graph_step(self, x: Any, y: Any) -> Any:
        assert self.static is not None
        sx, sy, static_loss = self.static
        with annotate("input_copy"):  # into the tensors the graph reads
            sx.copy_(x, non_blocking=self.args.non_blocking)
            sy.copy_(y, non_blocking=self.args.non_blocking)
        with annotate("replay"):
            self.graph.replay()
        return static_loss.clone()


def run(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Warm up, time the windows, run the profiled steps; every loss kept, read back every --loss-every steps."""
    torch = require_torch("cnn_training.py")
    gpu = device == "cuda"

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    t_setup = time.perf_counter()
    trainer = Trainer(args, device)
    data = batches(args, device)
    losses: list[float] = []
    pending: list[Any] = []

    def read_losses() -> None:
        if pending:
            losses.extend(torch.stack(pending).float().tolist())  # one copy back, one wait, for many steps
            pending.clear()

    def one_step(step: int) -> None:
        with annotate("data_wait"):
            x, y = next(data)
        if trainer.graph is not None:
            loss = trainer.graph_step(x, y)
        else:
            loss = trainer.eager_step(*trainer.place(x, y))
        pending.append(loss)
        if (step + 1) % args.loss_every == 0:
            with annotate("loss_read"):
                read_losses()

    setup_s = time.perf_counter() - t_setup
    warmup_s: list[float] = []
    warmup_graphs: list[int | None] = []  # with --compile: graphs compiled so far, after each warm-up step
    with annotate("warmup"):
        for step in range(args.warmup):
            t0 = time.perf_counter()
            if args.cuda_graphs and step == args.warmup - 3:
                pending.extend(trainer.warm_graph(*trainer.place(*next(data)), 3))
                sync()
                warmup_s.append(time.perf_counter() - t0)
                warmup_graphs.append(compiled_graphs(args))
                break
            one_step(step)
            read_losses()
            sync()
            warmup_s.append(time.perf_counter() - t0)
            warmup_graphs.append(compiled_graphs(args))
    step = len(losses) + len(pending)
    read_losses()
    windows: list[dict[str, float]] = []

    def timed_step() -> None:
        nonlocal step
        with annotate(f"step_{step}"):
            one_step(step)
        step += 1

    for w in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        done = window_steps(timed_step, args.steps, args.min_window_s, time.perf_counter)
        read_losses()
        sync()
        seconds = time.perf_counter() - t0
        windows.append({"steps": done, "seconds": seconds, "images_per_s": done * args.batch_size / seconds})
        print(f"  window {w + 1}/{args.repeats}: {done} steps in {seconds * 1e3:.1f} ms, "
              f"{windows[-1]['images_per_s']:,.0f} images/s", flush=True)
    if args.profile_steps:
        sync()
        if gpu:
            torch.cuda.profiler.start()
        for _ in range(args.profile_steps):
            with annotate(f"step_{step}"):
                one_step(step)
            step += 1
        read_losses()
        sync()
        if gpu:
            torch.cuda.profiler.stop()
    return {"setup_s": setup_s, "warmup_step_s": warmup_s, "windows": windows, "losses": losses,
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated()) if gpu else None,
            "precision": precision(torch), "compile_counters": compile_counters(args),
            "compiled_graphs_by_warmup_step": warmup_graphs, "compiled_graphs": compiled_graphs(args)}


def precision(torch: Any) -> dict[str, Any]:
    """The FP32 arithmetic PyTorch allowed in this run: its defaults let cuDNN run FP32 convolutions on TF32 tensor
    cores (``cudnn.allow_tf32``) but keep FP32 matrix products in FP32 (``cuda.matmul.allow_tf32``).

    Each switch is read through whichever API can read it: PyTorch (2.7 on) also has
    ``fp32_precision`` names for them, and once a program has set the two APIs differently,
    reading the legacy flags raises ("a mix of the legacy and new APIs"); a record that crashed
    the run would be worse than one that says which API answered.
    """
    def read(legacy: Callable[[], Any], new: Callable[[], Any]) -> Any:
        try:
            return legacy()
        except RuntimeError:
            try:
                return f"fp32_precision={new()}"
            except (RuntimeError, AttributeError):
                return "unreadable"

    backends = torch.backends
    return {"cudnn_allow_tf32": read(lambda: bool(backends.cudnn.allow_tf32), lambda: backends.cudnn.conv.fp32_precision),
            "matmul_allow_tf32": read(lambda: bool(backends.cuda.matmul.allow_tf32),
                                      lambda: backends.cuda.matmul.fp32_precision),
            "float32_matmul_precision": read(torch.get_float32_matmul_precision,
                                             lambda: backends.cuda.matmul.fp32_precision)}


def compile_counters(args: argparse.Namespace) -> dict[str, int] | None:
    """With --compile: Inductor's own counters (``torch._dynamo.utils.counters["inductor"]``), among them
    ``cudagraph_skips`` when reduce-overhead could not graph a region; None without --compile."""
    if args.compile == "off":
        return None
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return {k: int(v) for k, v in counters["inductor"].items()}


def compiled_graphs(args: argparse.Namespace) -> int | None:
    """With --compile: the graphs TorchDynamo has compiled in this process so far (its ``unique_graphs`` counter,
    a count that does not depend on how fast the machine is, nor on Inductor's cache); None without --compile."""
    if args.compile == "off":
        return None
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["stats"]["unique_graphs"])


def window_steps(step: Callable[[], None], steps: int, min_seconds: float, clock: Callable[[], float]) -> int:
    """Run ``step`` ``steps`` times, then on until ``min_seconds`` have passed on ``clock``; returns the steps run.

    The rule behind --min-window-s, apart from the training so that it can be tested with a
    clock that does not depend on how fast the machine is.
    """
    t0 = clock()
    done = 0
    while done < steps or clock() - t0 < min_seconds:
        step()
        done += 1
    return done


# Fewer losses than this are not judged: the mean of 10 steps against that of 10 others needs 20. Measured on
# the CPU (batch 16, seeds 0-2, with and without --data-on-gpu and --bf16): from 20 steps on the mean loss fell
# at least 3.4% at every length up to 105; below 20 it rose by up to 10% at some lengths (5, 6, 9 steps).
MIN_STEPS_JUDGED = 20


def loss_check(losses: list[float], span: int = 10) -> dict[str, Any]:
    """Mean loss of the first and of the last ``span`` steps, the fall between them (a fraction), and whether the
    run was long enough for the fall to be a verdict (``judged``)."""
    span = max(1, min(span, len(losses) // 2))
    first, last = statistics.fmean(losses[:span]), statistics.fmean(losses[-span:])
    return {"first": first, "last": last, "fall": (first - last) / first, "span": span,
            "judged": len(losses) >= MIN_STEPS_JUDGED}


def require_fit(args: argparse.Namespace, device: str) -> None:
    """Refuse, before generating anything, an image set or a batch that this machine cannot hold."""
    from gpuprof.cli import require_memory
    from gpuprof.models import small_cnn, training_bytes
    from gpuprof import cnn_data

    data = args.dataset_size * (cnn_data.SIZE ** 2 * 3 + 8)  # uint8 images and int64 labels
    step = training_bytes(small_cnn, (3, cnn_data.SIZE, cnn_data.SIZE), args.batch_size, optimizer_states=2,
                          half_precision=args.bf16)  # Adam: two states per weight
    on_device = data if args.data_on_gpu else 0  # the set is copied to the device once
    host = data + on_device  # (through a channels-first copy on the host)
    what = f"{args.dataset_size:,} images and training at batch {args.batch_size:,}"
    if device == "cpu":
        require_memory(host + step, "cpu", what, "--dataset-size or --batch-size", lower_bound=True)
    else:
        require_memory(host, "cpu", f"{args.dataset_size:,} generated images", "--dataset-size")
        require_memory(step + on_device, "cuda", what, "--dataset-size or --batch-size", lower_bound=True)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("cnn_training.py")
    gpu = torch.cuda.is_available() and not args.cpu
    device = "cuda" if gpu else "cpu"
    config = levers(args)
    naive = levers(parse_args([]))
    on = [k for k, v in config.items() if k != "batch_size" and v != naive[k]]
    where = torch.cuda.get_device_name() if gpu else "the CPU"
    print(f"cnn_training: batch {args.batch_size} on {where}; levers: {', '.join(on) or 'none (the naive loop)'}", flush=True)
    idle = [k for k in GPU_ONLY if config[k]] if not gpu else []
    if not gpu:
        print("  no GPU here (or --cpu): the loop runs on the CPU" + (f"; {', '.join(idle)} have nothing to act on" if idle else ""))
        args.cuda_graphs = False  # CUDA graphs need a GPU; the step runs eagerly instead
    require_fit(args, device)
    try:
        result = run(args, device)
    except torch.cuda.OutOfMemoryError:
        if args.json:
            from gpuprof.kernels import write_json

            write_json(args.json, {"config": config, "device": device, "gpu": where, "torch": torch.__version__,
                                   "status": "out of memory"})
        raise GpuprofError(f"out of GPU memory at batch {args.batch_size} ({where}).",
                           "Choose a smaller --batch-size, or turn on --bf16.") from None
    rates = [w["images_per_s"] for w in result["windows"]]
    check = loss_check(result["losses"])
    print(f"  median {statistics.median(rates):,.0f} images/s over {args.repeats} windows "
          f"(range {min(rates):,.0f}-{max(rates):,.0f}); first step {result['warmup_step_s'][0]:.2f} s "
          f"(setup {result['setup_s']:.1f} s before it)")
    if result["peak_memory_bytes"] is not None:
        print(f"  peak GPU memory allocated: {result['peak_memory_bytes'] / 2**20:.0f} MiB")
    steps = len(result["losses"])
    if not check["judged"]:
        print(f"loss not checked: {steps} steps are too few to judge training (the check needs {MIN_STEPS_JUDGED}; over "
              f"fewer, this data's loss rises and falls by several percent)")
    elif not check["fall"] > 0:
        raise GpuprofError(f"training did not work: the mean loss of the last {check['span']} steps ({check['last']:.3f}) "
                           f"is not below the first {check['span']}'s ({check['first']:.3f}).")
    else:
        print(f"result checked: mean loss fell {check['fall']:.0%} ({check['first']:.3f} over the first {check['span']} "
              f"steps -> {check['last']:.3f} over the last {check['span']}, {steps} steps)")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"config": config, "device": device, "gpu": where, "torch": torch.__version__,
                               "status": "ok", "idle_levers": idle, "warmup": args.warmup,
                               "images_per_s": statistics.median(rates), "loss_check": check,
                               **result, "losses": [round(v, 5) for v in result["losses"]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
