#!/usr/bin/env python3
"""One transformer trained three ways, DDP and FSDP2 with or without resharding, marked for Nsight Systems.

The model is a causal language model built from PyTorch's ``nn.TransformerEncoderLayer``
(``gpuprof.models.transformer_lm``), trained with AdamW on one fixed batch of random tokens
per rank (the loss must fall; the run checks that it did). Each --mode runs in turn in the
same processes, from the same initial weights on the same data:

  ddp            DistributedDataParallel: every GPU holds the whole model, its gradients and
                 AdamW's state; gradients all-reduced bucket by bucket during backward
                 (gradient_as_bucket_view=True, so the buckets are the gradients, counted once)
  fsdp_reshard   FSDP2 (torch.distributed.fsdp.fully_shard) on every unit, then on the whole
                 model: each rank keeps 1/N of every parameter, gradient and optimizer state;
                 a unit's parameters are all-gathered before its forward, freed after it
                 (reshard_after_forward=True), all-gathered again before its backward, and its
                 gradients reduce-scattered after it
  fsdp_keep      the same with reshard_after_forward=False: no all-gather in backward, the
                 gathered parameters kept from forward to backward (more memory)
  (the root, the embeddings and the head, is sharded with reshard_after_forward=False in both,
  as FSDP2's documentation recommends: its parameters are needed again at once in backward)

Levers (FSDP2):
  --unit layer|block:N   what one fully_shard call wraps: each layer, or runs of N layers
  --prefetch default|off|N
                         default: FSDP2's own schedule (a unit's all-gather is issued when the CPU
                         reaches it, which runs ahead of the GPU; in backward, one unit ahead);
                         N: explicit prefetch of the next N units in forward and in backward
                         (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch);
                         off: no prefetch at all, the baseline prefetching is measured against:
                         each unit prefetches only itself in backward (which turns FSDP2's default
                         off), and before each unit's all-gather the CPU waits for the GPU to
                         finish what it has queued, in forward and in backward, so that no
                         all-gather can start under earlier computation (the reduce-scatters still
                         run under the next unit's backward)
  --mp bf16              FSDP2: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32):
                         all-gathers and compute in BF16, reduce-scatters in FP32, the sharded
                         parameters, gradients and AdamW state in FP32; DDP: autocast to BF16
                         (its parameters, gradients and all-reduces stay FP32)

NVTX ranges, per rank: ``rank_R`` around the run; ``mode_<MODE>`` around each mode; inside it
``warmup`` and ``step_N``, and inside a step ``forward``, ``backward`` and ``optimizer``;
``cpu_waits_for_gpu`` where --prefetch off makes the CPU wait.

Measured per rank and mode: each step's time and its phases (CUDA events on a GPU, read after
the step; host clock on a CPU); memory by category: parameters, gradients and optimizer state
from the local sizes of the tensors this rank holds (a shard's, under FSDP2), beside the
arithmetic (gpuprof.studies.sharded_training); on a GPU, the step's peak allocated memory and
activations = peak minus the three (gradients are kept between steps, zero_grad(set_to_none=False),
so the three are resident at the peak), the peak of each phase (forward, backward, optimizer), the
bytes allocated at the end of forward, and those still allocated when the mode began (an earlier
mode's leftovers would count in this one's peak); under FSDP2, how many units' all-gathers had been issued
before the unit was reached (prefetched), in forward and in backward.

Every rank writes its own JSON (--json FILE: FILE's stem + _rank<R>.json), and rank 0 writes
FILE with every rank's record.

Examples:
  torchrun --standalone --nproc-per-node 2 examples/nsys/fsdp_training.py
  torchrun --standalone --nproc-per-node 2 examples/nsys/fsdp_training.py --mode fsdp_reshard --prefetch off
  torchrun --standalone --nproc-per-node 2 examples/nsys/fsdp_training.py --mode fsdp_reshard --unit block:4 --mp bf16
  torchrun --standalone --nproc-per-node 2 examples/nsys/fsdp_training.py --size ddp-too-big --mode fsdp_reshard
  one report per rank (nsys runs inside each rank):
  torchrun --standalone --nproc-per-node 2 --no-python \\
      nsys profile --trace=cuda,nvtx -o fsdp_rank%q{RANK} python examples/nsys/fsdp_training.py

Without torchrun it runs as one process (world size 1: nothing to communicate, which it says):
the computation alone, the per-unit compute a model of many GPUs starts from. Sizes: --size
tiny on a CPU, chapter on a GPU; ddp-too-big takes the smallest number of layers (at d_model
4096) whose parameters, gradients and AdamW state alone exceed this GPU's memory, so that DDP
is refused and FSDP2 over enough GPUs runs; any of the size flags overrides the preset.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_float, positive_int  # noqa: E402
from gpuprof.distributed import join_group, torchrun_place  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

MODES = ("ddp", "fsdp_reshard", "fsdp_keep")
SIZE_KEYS = ("vocab", "d_model", "heads", "d_ff", "layers", "context", "batch_size")
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"vocab": 256, "d_model": 64, "heads": 4, "d_ff": 256, "layers": 4, "context": 32, "batch_size": 4},
    "chapter": {"vocab": 32000, "d_model": 2048, "heads": 16, "d_ff": 8192, "layers": 16, "context": 1024,
                "batch_size": 4},
    # layers: chosen from the GPU's memory (ddp_too_big_layers)
    "ddp-too-big": {"vocab": 32000, "d_model": 4096, "heads": 32, "d_ff": 16384, "layers": 0, "context": 1024,
                    "batch_size": 1},
}
ADAMW_STATES = 2  # exp_avg and exp_avg_sq, each shaped like its parameter


def mode_list(text: str) -> list[str]:
    """argparse type: modes separated by commas, each once."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"no mode {', '.join(unknown) or '(none given)'}; the modes are {', '.join(MODES)}")
    if len(set(modes)) < len(modes):
        raise argparse.ArgumentTypeError(f"a mode is named twice in {text!r}")
    return modes


def unit_spec(text: str) -> int:
    """argparse type: ``layer`` (1) or ``block:N`` (N layers per unit)."""
    if text == "layer":
        return 1
    head, _, count = text.partition(":")
    if head == "block" and count.isdigit() and int(count) >= 1:
        return int(count)
    raise argparse.ArgumentTypeError(f"expected layer or block:N (N a whole number of layers, at least 1), got {text!r}")


def prefetch_spec(text: str) -> str | int:
    """argparse type: ``default``, ``off`` or a number of units (at least 1)."""
    if text in ("default", "off"):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected default, off or a number of units (at least 1), got {text!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", type=mode_list, default=list(MODES), metavar="MODE[,MODE...]",
                   help="ddp, fsdp_reshard, fsdp_keep; several run one after another (default: all three)")
    p.add_argument("--unit", type=unit_spec, default=1, metavar="layer|block:N",
                   help="FSDP2's unit: each layer (default) or runs of N layers")
    p.add_argument("--prefetch", type=prefetch_spec, default="default", metavar="default|off|N",
                   help="FSDP2's all-gather prefetching (default: FSDP2's own schedule)")
    p.add_argument("--mp", choices=("none", "bf16"), default="none",
                   help="bf16: FSDP2 MixedPrecisionPolicy(param bf16, reduce fp32); DDP autocast (default: none)")
    p.add_argument("--size", choices=tuple(PRESETS), default=None,
                   help="model preset (default: tiny on a CPU, chapter on a GPU)")
    p.add_argument("--vocab", type=positive_int, default=None, help="vocabulary (embedding and head rows)")
    p.add_argument("--d-model", type=positive_int, default=None, help="width of the model")
    p.add_argument("--heads", type=positive_int, default=None, help="attention heads (must divide --d-model)")
    p.add_argument("--d-ff", type=positive_int, default=None, help="width of the feed-forward layer")
    p.add_argument("--layers", type=positive_int, default=None, help="transformer layers")
    p.add_argument("--context", type=positive_int, default=None, help="tokens per sequence")
    p.add_argument("--batch-size", type=positive_int, default=None, help="sequences per rank")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW's learning rate (default: 1e-3)")
    p.add_argument("--warmup", type=positive_int, default=2, help="untimed steps first, per mode (default: 2)")
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per mode (default: 5)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo) even where GPUs are available")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="each rank writes FILE's stem + _rank<R>.json; rank 0 also writes FILE with every rank's")
    args = p.parse_args(argv)
    if args.size == "ddp-too-big" and args.layers is not None:
        p.error("--size ddp-too-big chooses --layers from the GPU's memory: give one or the other")
    return args


def resolve_sizes(args: argparse.Namespace, gpu: bool, total_gpu_bytes: int | None) -> None:
    """Fill the size flags left unset from the preset (tiny on a CPU, chapter on a GPU); check they make a model."""
    size = args.size or ("chapter" if gpu else "tiny")
    args.size = size
    for key, value in PRESETS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if size == "ddp-too-big":
        if not gpu or total_gpu_bytes is None:
            raise GpuprofError("--size ddp-too-big is sized from a GPU's memory, and this run has no GPU.",
                               "Run it on GPUs, or give the size flags (--layers, --d-model, ...) instead.")
        args.layers = ddp_too_big_layers(args, total_gpu_bytes)
    if args.d_model % args.heads:
        raise GpuprofError(f"--d-model {args.d_model} is not divisible by --heads {args.heads}.",
                           "Choose a number of heads that divides the width.")


def parameter_count(args: argparse.Namespace, layers: int | None = None) -> int:
    from gpuprof.models import transformer_lm_parameters

    return transformer_lm_parameters(args.vocab, args.d_model, args.d_ff, layers or args.layers, args.context)["total"]


def ddp_too_big_layers(args: argparse.Namespace, total_gpu_bytes: int) -> int:
    """The fewest layers whose FP32 parameters, gradients and AdamW state (16 bytes a parameter) exceed the GPU."""
    per_parameter = 4 * (2 + ADAMW_STATES)
    layers = 1
    while parameter_count(args, layers) * per_parameter <= total_gpu_bytes:
        layers += 1
    return layers


def build(args: argparse.Namespace, torch: Any, device: str) -> Any:
    """The model on ``device`` from seed 0: the same initial weights on every rank and in every mode."""
    from gpuprof.models import transformer_lm

    torch.manual_seed(0)
    with torch.device(device):
        return transformer_lm(args.vocab, args.d_model, args.heads, args.d_ff, args.layers, args.context, args.unit)


def batch(args: argparse.Namespace, torch: Any, rank: int, device: str) -> tuple[Any, Any]:
    """This rank's fixed batch of random tokens and targets (seeded by rank: each rank its own data shard)."""
    g = torch.Generator().manual_seed(1 + rank)
    tokens = torch.randint(0, args.vocab, (args.batch_size, args.context), generator=g)
    targets = torch.randint(0, args.vocab, (args.batch_size, args.context), generator=g)
    return tokens.to(device), targets.to(device)


# --- memory: the arithmetic, the refusal, the measurement ---------------------------------------------------------

def shapes(args: argparse.Namespace, torch: Any) -> list[tuple[int, ...]]:
    """Every parameter's shape, from the model built on the meta device (nothing allocated)."""
    return [tuple(p.shape) for p in build(args, torch, "meta").parameters()]


def unit_bytes(args: argparse.Namespace, torch: Any, element: int) -> int:
    """Bytes of the largest unit's parameters at ``element`` bytes each: what one all-gather brings in."""
    model = build(args, torch, "meta")
    return max(sum(p.numel() for p in run.parameters()) for run in model.blocks) * element


def unit_parameters(args: argparse.Namespace, torch: Any) -> list[int]:
    """Parameters of the root (everything outside the units: embeddings, final norm, head), then of each unit."""
    model = build(args, torch, "meta")
    units = [sum(p.numel() for p in run.parameters()) for run in model.blocks]
    return [sum(p.numel() for p in model.parameters()) - sum(units), *units]


def required_bytes(args: argparse.Namespace, torch: Any, mode: str, world: int) -> dict[str, int]:
    """A lower bound on one rank's memory for ``mode``, by category, known before anything is allocated.

    Parameters, gradients and AdamW state from gpuprof.studies.sharded_training's arithmetic;
    the activations autograd saves in one forward (gpuprof.models.saved_tensor_bytes on the meta
    device, halved under --mp bf16); under FSDP2, the gathered units (resharding: the ones in
    flight, the unit being computed and those prefetched, at least two; keeping: every unit, from
    its forward to its backward) and the unsharded gradients of the units in flight; and the whole
    model in FP32 while it is built, before FSDP2 shards it.
    """
    from gpuprof.models import saved_tensor_bytes
    from gpuprof.studies.sharded_training import memory_arithmetic

    need = memory_arithmetic(shapes(args, torch), world, mode, param_bytes=4, optimizer_states=ADAMW_STATES)
    _, saved = saved_tensor_bytes(lambda: build(args, torch, "meta"),
                                  lambda: torch.zeros(args.batch_size, args.context, dtype=torch.long))
    need["activations"] = saved // (2 if args.mp == "bf16" else 1)
    if mode != "ddp":
        in_flight = 1 + (args.prefetch if isinstance(args.prefetch, int) else 1)
        element = 2 if args.mp == "bf16" else 4
        unit = unit_bytes(args, torch, element)
        # resharding, the units in flight; keeping, every unit stays gathered from its forward to its backward
        kept = parameter_count(args) * element if mode == "fsdp_keep" else in_flight * unit
        need["gathered_units"] = kept + in_flight * unit  # and the unsharded gradients of the units in flight
    need["while_building"] = parameter_count(args) * 4
    return need


def require_fit(args: argparse.Namespace, torch: Any, world: int, device: str) -> None:
    """Refuse, in one sentence and before anything is allocated, a mode whose lower bound exceeds the free memory."""
    from gpuprof.memory_probe import available_memory, total_memory

    where = "cpu" if device == "cpu" else "cuda"
    free, total = available_memory(where), total_memory(where)
    if free is None:
        return
    for mode in args.mode:
        need = required_bytes(args, torch, mode, world)
        steady = sum(v for k, v in need.items() if k != "while_building")
        least = max(steady, need["while_building"])
        if least <= free:
            continue
        gib = {k: v / 2**30 for k, v in need.items()}
        parts = (f"parameters {gib['parameters']:,.1f}, gradients {gib['gradients']:,.1f}, AdamW state "
                 f"{gib['optimizer_state']:,.1f}, activations {gib['activations']:,.1f}"
                 + (f", gathered units {gib['gathered_units']:,.1f}" if "gathered_units" in gib else "") + " GiB")
        place = "in host memory" if where == "cpu" else "on this GPU"
        of = f" (of {total / 2**30:,.1f} GiB)" if total else ""
        hint = ("Shard it over more GPUs (torchrun --nproc-per-node), or choose a smaller --layers, --d-model or "
                "--batch-size." if mode != "ddp" else
                "Shard it over several GPUs (--mode fsdp_reshard under torchrun --nproc-per-node N), or choose a smaller "
                "--layers, --d-model or --batch-size.")
        building = "" if least == steady else "; the whole model while it is built before sharding: more"
        raise GpuprofError(f"--mode {mode} at {world} rank(s) would take at least {least / 2**30:,.1f} GiB per "
                           f"{'process' if where == 'cpu' else 'GPU'} ({parts}{building}), "
                           f"but only {free / 2**30:,.1f} GiB is available {place}{of}.", hint)


def local_bytes(tensors: Any) -> int:
    """Bytes this rank holds of ``tensors``: a DTensor's local shard, a plain tensor whole; 0-d tensors left out."""
    total = 0
    for t in tensors:
        if t is None or t.dim() == 0:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def measured_memory(model: Any, opt: Any) -> dict[str, int]:
    """Parameters, gradients and optimizer state this rank holds now, from the tensors' local sizes."""
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if hasattr(t, "dim")]
    return {"parameters": local_bytes(params), "gradients": local_bytes(p.grad for p in params),
            "optimizer_state": local_bytes(state)}


# --- FSDP2 ---------------------------------------------------------------------------------------------------------

def param_groups(unit: Any) -> list[Any]:
    """FSDP2's parameter groups of a unit (private state: read to observe prefetching, never changed); [] if unknown."""
    try:
        state = unit._get_fsdp_state()
    except AttributeError:
        return []
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        one = getattr(state, "_fsdp_param_group", None)
        groups = [] if one is None else [one]
    return list(groups)


def gather_issued(unit: Any) -> bool | None:
    """Whether ``unit``'s all-gather has been issued (or it is already gathered); None where torch does not say."""
    groups = param_groups(unit)
    if not groups or not all(hasattr(g, "_all_gather_result") and hasattr(g, "is_unsharded") for g in groups):
        return None
    return all(g._all_gather_result is not None or g.is_unsharded for g in groups)


class PrefetchWatch:
    """Hooks on each unit, run before FSDP2's own: they count the units whose all-gather was issued before the unit
    was reached (prefetched), and under --prefetch off make the CPU wait for the GPU there first.

    A forward pre-hook, prepended after fully_shard so that it runs before FSDP2's (also prepended, earlier);
    for backward, a forward hook, prepended, that puts a hook on the unit's output: it runs when that output's
    gradient arrives, before FSDP2's own hook on the same tensor (registered after it), which gathers the unit.
    """

    def __init__(self, torch: Any, units: list[Any], wait: bool, gpu: bool) -> None:
        self.torch, self.wait, self.gpu = torch, wait, gpu
        self.forward: list[bool | None] = []
        self.backward: list[bool | None] = []
        for unit in units:
            unit.register_forward_pre_hook(self._pre_forward(unit), prepend=True)
            unit.register_forward_hook(self._post_forward(unit), prepend=True)

    def reset(self) -> None:
        self.forward, self.backward = [], []

    def _cpu_waits(self) -> None:
        if self.wait and self.gpu:
            with annotate("cpu_waits_for_gpu"):
                self.torch.cuda.current_stream().synchronize()

    def _pre_forward(self, unit: Any) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            self.forward.append(gather_issued(unit))
            self._cpu_waits()
        return hook

    def _post_forward(self, unit: Any) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            if not getattr(output, "requires_grad", False):
                return

            def grad_hook(grad: Any) -> Any:
                self.backward.append(gather_issued(unit))
                self._cpu_waits()
                return grad
            output.register_hook(grad_hook)
        return hook

    def counts(self, units: int, reshard: bool) -> dict[str, Any]:
        """Of the last step: units whose all-gather was issued before they were reached, forward and backward."""
        def count(seen: list[bool | None]) -> int | None:
            return None if not seen or None in seen else sum(bool(s) for s in seen)
        return {"units": units, "forward": count(self.forward),
                "backward": count(self.backward) if reshard else None,  # kept from forward: nothing to gather
                "readable": not (None in self.forward or None in self.backward)}


class MemoryProbe:
    """Where in the step the peak falls, and what was resident before the mode began (GPU only; a no-op on a CPU).

    The step's peak minus the parameters, gradients and optimizer state is the page's "activations and
    buffers". Two questions that figure cannot answer alone: is the peak reached in forward, backward or
    the optimizer step (each phase's own peak, the allocator's high-water mark reset at each phase's end),
    and did anything of an earlier mode stay allocated (``resident_before``: bytes allocated when the mode
    starts, before its model is built; an earlier mode's leftovers count in this mode's peak). The
    allocator counts on the CPU at allocation time, so reading it needs no synchronisation.
    """

    PHASES = ("forward", "backward", "optimizer")

    def __init__(self, torch: Any, gpu: bool) -> None:
        self.torch, self.gpu = torch, gpu
        self.resident_before = torch.cuda.memory_allocated() if gpu else None
        self.peaks: dict[str, int] = {}
        self.after_forward = 0

    def start(self) -> None:
        """At the timed steps' start: the high-water mark from here on."""
        if self.gpu:
            self.torch.cuda.reset_peak_memory_stats()

    def phase_done(self, phase: str) -> None:
        """At the end of ``phase`` of a timed step: its peak (the largest over the steps), then a fresh mark."""
        if not self.gpu:
            return
        cuda = self.torch.cuda
        self.peaks[phase] = max(self.peaks.get(phase, 0), int(cuda.max_memory_allocated()))
        if phase == "forward":
            self.after_forward = max(self.after_forward, int(cuda.memory_allocated()))
        cuda.reset_peak_memory_stats()

    def record(self) -> dict[str, Any]:
        """The fields the JSON's memory record gains: the step's peak (the largest phase peak) and the rest."""
        if not self.gpu:
            return {}
        return {"peak": max(self.peaks.values()), "phase_peaks": dict(self.peaks), "after_forward": self.after_forward,
                "resident_before": self.resident_before}


def shard(args: argparse.Namespace, torch: Any, model: Any, mode: str, gpu: bool) -> PrefetchWatch:
    """fully_shard every unit, then the root; set the prefetching --prefetch asks for; install the watch."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.mp == "bf16"
          else MixedPrecisionPolicy())
    units = list(model.blocks)
    for unit in units:
        fully_shard(unit, reshard_after_forward=(mode == "fsdp_reshard"), mp_policy=mp)
    fully_shard(model, reshard_after_forward=False, mp_policy=mp)
    if args.prefetch == "off":
        for module in [*units, model]:
            module.set_modules_to_backward_prefetch([module])  # itself, already gathered: FSDP2's default one-ahead off
    elif isinstance(args.prefetch, int):
        n = args.prefetch
        model.set_modules_to_forward_prefetch(units[:n])
        model.set_modules_to_backward_prefetch(units[::-1][:n])
        for i, unit in enumerate(units):
            unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + n])
            unit.set_modules_to_backward_prefetch(units[max(0, i - n):i][::-1])
    return PrefetchWatch(torch, units, wait=args.prefetch == "off", gpu=gpu)


# --- training ------------------------------------------------------------------------------------------------------

def train(args: argparse.Namespace, torch: Any, rank: int, world: int, device: str, mode: str) -> dict[str, Any]:
    """Warm up, then time --steps steps of ``mode``; the memory by category, the losses, the prefetch counts."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpuprof.studies.sharded_training import memory_arithmetic
    from gpuprof.timing import Clock

    gpu = device.startswith("cuda")
    probe = MemoryProbe(torch, gpu)  # before the model: what an earlier mode left allocated
    model = build(args, torch, device)
    watch = None
    if mode == "ddp":
        wrapped = DDP(model, device_ids=[int(device.split(":")[1])] if gpu else None, gradient_as_bucket_view=True)
    else:
        watch = shard(args, torch, model, mode, gpu)
        wrapped = model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    tokens, targets = batch(args, torch, rank, device)
    autocast = (lambda: torch.autocast("cuda" if gpu else "cpu", dtype=torch.bfloat16)) \
        if mode == "ddp" and args.mp == "bf16" else contextlib.nullcontext
    clock = Clock(torch, gpu)

    def step(done: Callable[[str], None] = lambda phase: None) -> Any:
        clock.mark()
        with annotate("forward"), autocast():
            logits = wrapped(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        clock.mark()
        done("forward")
        with annotate("backward"):
            loss.backward()
        clock.mark()
        done("backward")
        with annotate("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated: resident at the peak, like parameters
        clock.mark()
        done("optimizer")
        return loss

    losses = []
    with annotate("warmup"):
        for _ in range(args.warmup):
            losses.append(float(step().detach()))
            clock.intervals_ms()
    if gpu:
        torch.cuda.synchronize()
    probe.start()
    steps = []
    for i in range(args.steps):
        if watch is not None:
            watch.reset()
        with annotate(f"step_{i}"):
            loss = step(probe.phase_done)
        if gpu:
            torch.cuda.synchronize()
        forward, backward, optimizer = clock.intervals_ms()
        losses.append(float(loss.detach()))
        steps.append({"step": forward + backward + optimizer, "forward": forward, "backward": backward,
                      "optimizer": optimizer, "loss": losses[-1]})
    held = measured_memory(model, opt)
    memory: dict[str, Any] = {"measured": held,
                              "arithmetic": memory_arithmetic([tuple(p.shape) for p in model.parameters()], world,
                                                              mode, rank, optimizer_states=ADAMW_STATES)}
    if gpu:
        memory.update(probe.record())
        memory["activations"] = memory["peak"] - sum(held.values())
    # the weights' sum over every rank's part: the same in every mode that trained the same model on the same data
    local = sum(float((p.to_local() if hasattr(p, "to_local") else p).detach().double().sum()) for p in model.parameters())
    total = torch.tensor([local if mode != "ddp" or rank == 0 else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    result = {"mode": mode, "losses": losses, "steps": steps, "memory": memory, "weights_sum": float(total),
              "prefetched": None if watch is None else watch.counts(len(model.blocks), mode == "fsdp_reshard")}
    # the last step's loss holds its autograd graph, whose FSDP2 nodes reach the sharded parameters and their
    # gradients: alive at gc.collect(), they would be cyclic garbage after return and count in the next mode's peak
    del wrapped, model, opt, watch, loss, step, tokens, targets
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    return result


def setup(args: argparse.Namespace) -> tuple[Any, int, int, str]:
    """Join the process group torchrun describes (or a group of one), size the model, refuse what cannot fit."""
    torch = require_torch("fsdp_training.py")
    rank, world, device = torchrun_place(torch, args.cpu)
    from gpuprof.memory_probe import total_memory

    resolve_sizes(args, device.startswith("cuda"), total_memory("cuda") if device.startswith("cuda") else None)
    require_fit(args, torch, world, device)
    join_group(torch, rank, world, device)
    return torch, rank, world, device


def describe(args: argparse.Namespace, torch: Any, world: int, device: str) -> str:
    """The run's first line: the model, the levers, where it runs."""
    import torch.distributed as dist

    where = f"{world} x {torch.cuda.get_device_name()}" if device.startswith("cuda") else f"{world} CPU process(es)"
    unit = "layer" if args.unit == 1 else f"block:{args.unit}"
    return (f"fsdp_training: {args.layers} layers of d_model {args.d_model} (d_ff {args.d_ff}, {args.heads} heads), "
            f"vocab {args.vocab}, {parameter_count(args):,} parameters; batch {args.batch_size} x {args.context} tokens "
            f"per rank; modes {', '.join(args.mode)}; unit {unit}, prefetch {args.prefetch}, mp {args.mp}; "
            f"on {where} ({dist.get_backend()})")


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per mode and rank: median step and phases, the memory by category (MiB) beside the arithmetic."""
    lines = []
    for r in results:
        for run in r["runs"]:
            st = run["steps"]
            med = {k: statistics.median(s[k] for s in st) for k in ("step", "forward", "backward", "optimizer")}
            m = run["memory"]
            mib = ", ".join(f"{k} {m['measured'][k] / 2**20:,.1f} (arithmetic {m['arithmetic'][k] / 2**20:,.1f})"
                            for k in ("parameters", "gradients", "optimizer_state"))
            extra = "" if m.get("peak") is None else (f", peak {m['peak'] / 2**20:,.1f}, activations and buffers "
                                                      f"{m['activations'] / 2**20:,.1f}")
            pf = run["prefetched"]
            pre = "" if not pf or pf["forward"] is None else (
                f"; prefetched: forward {pf['forward']}/{pf['units']}"
                + ("" if pf["backward"] is None else f", backward {pf['backward']}/{pf['units']}"))
            lines.append(f"  {run['mode']}, rank {r['rank']}: step {med['step']:.2f} ms median (forward {med['forward']:.2f}, "
                         f"backward {med['backward']:.2f}, optimizer {med['optimizer']:.2f}); MiB: {mib}{extra}{pre}")
    return lines


def check(results: list[dict[str, Any]], world: int) -> str:
    """The result's checks, as the sentence the run ends with: every mode's loss fell, on every rank; the modes agree."""
    from gpuprof.models import check_loss_fell

    for r in results:
        for run in r["runs"]:
            check_loss_fell(run["losses"])
    runs = results[0]["runs"]
    first = runs[0]
    spread = max((abs(a - b) / abs(b) for run in runs[1:] for a, b in zip(run["losses"], first["losses"])), default=0.0)
    sums = max((abs(run["weights_sum"] - first["weights_sum"]) / max(abs(first["weights_sum"]), 1e-30) for run in runs[1:]),
               default=0.0)
    said = f"result checked: the loss fell in every mode on all {world} rank(s)"
    if len(runs) == 1:
        return said
    others = ", ".join(run["mode"] for run in runs[1:])
    return (f"{said}; {others} against {first['mode']}: rank 0's losses within {spread:.2g} (relative), "
            f"the weights' sums within {sums:.2g}")


def json_paths(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.stem}_rank{rank}{path.suffix}")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, rank, world, device = setup(args)
    import torch.distributed as dist

    try:
        if rank == 0:
            print(describe(args, torch, world, device), flush=True)
            if world == 1:
                print("  one process: nothing is all-gathered, reduce-scattered or all-reduced (start it with torchrun "
                      "--nproc-per-node N); the computation alone", flush=True)
        runs = []
        with annotate(f"rank_{rank}"):
            for mode in args.mode:
                with annotate(f"mode_{mode}"):
                    runs.append(train(args, torch, rank, world, device, mode))
                if rank == 0:
                    print(f"  {mode}: {args.warmup} + {args.steps} steps done", flush=True)
        from gpuprof.timing import Clock

        record = {"rank": rank, "world_size": world, "device": device.split(":")[0], "backend": dist.get_backend(),
                  "timing": Clock(torch, device.startswith("cuda")).method, "parameters": parameter_count(args),
                  "units": -(-args.layers // args.unit), "unit_parameters": unit_parameters(args, torch), "runs": runs}
        results: list[Any] = [None] * world
        dist.all_gather_object(results, record)
    finally:
        dist.destroy_process_group()
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"}
    if args.json:
        from gpuprof.kernels import write_json

        write_json(json_paths(args.json, rank), {"config": config, **record})
    if rank != 0:
        return 0
    print("\n".join(summary_lines(results)))
    print(check(results, world))
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"config": config, "world_size": world, "ranks": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
