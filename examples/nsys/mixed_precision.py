#!/usr/bin/env python3
"""Fine-tune a BERT-base-sized encoder in four precisions: what autocast and the loss scaler change, step by step.

The model is written here from torch.nn parts (no download): token and position embeddings,
--layers post-LayerNorm encoder layers (BERT-base: 12 layers, d_model 768, 12 heads, d_ff 3072,
GELU), a classifier on the first token, cross-entropy, AdamW. Every mode starts from the same
weights (--seed) and trains on the same batch every step, so their loss curves can be laid
over one another. The modes:

  fp32           FP32 tensors and FP32 arithmetic: TF32 off for matrix products and cuDNN
  tf32           FP32 tensors, matrix products on TF32 tensor cores (both switches on)
  fp16           torch.autocast(float16) and a GradScaler (loss scaling)
  bf16           torch.autocast(bfloat16), no scaler (bf16 has FP32's exponent range)
  fp16-noscaler  autocast(float16) without the scaler: the failure case, on purpose

Per step it records the loss, the phases' times with CUDA events (forward, backward, optimizer:
for fp16 the scaler's unscale, inf check and update are inside it), the scaler's scale and
whether it skipped the step. At the first step it also counts the gradient elements that are
exactly zero in this mode but not in an FP32 reference backward of the same batch from the same
weights: gradients that underflowed. NVTX ranges for Nsight Systems: warmup, then step_N with
forward, backward and optimizer_step inside. Without a GPU it runs on the CPU (autocast on the
CPU), for checking the script, not for timing.

Examples:
  python examples/nsys/mixed_precision.py --mode bf16
  python examples/nsys/mixed_precision.py --mode fp16-noscaler --steps 5 --json f16.json
  nsys profile --trace=cuda,nvtx -o bf16 python examples/nsys/mixed_precision.py --mode bf16
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import (bounded_int, nonnegative_int, output_file, positive_int, require_memory,  # noqa: E402
                         require_torch, torch_device)
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402

MODES = ("fp32", "tf32", "fp16", "bf16", "fp16-noscaler")
VOCAB = 30522  # BERT's WordPiece vocabulary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="fp32", help="precision (default: fp32)")
    m = p.add_argument_group("the model (default: BERT-base)")
    m.add_argument("--layers", type=bounded_int(48, "a BERT-large has 24"), default=12, help="encoder layers (default: 12)")
    m.add_argument("--d-model", type=positive_int, default=768, help="width (default: 768)")
    m.add_argument("--heads", type=positive_int, default=12, help="attention heads (default: 12)")
    m.add_argument("--d-ff", type=positive_int, default=3072, help="feed-forward width (default: 3072)")
    r = p.add_argument_group("the run")
    r.add_argument("--batch-size", type=positive_int, default=32, help="sequences per step (default: 32)")
    r.add_argument("--seq-len", type=bounded_int(512, "BERT's positions stop at 512"), default=128,
                   help="tokens per sequence (default: 128, at most 512)")
    r.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps first (default: 3)")
    r.add_argument("--steps", type=positive_int, default=10, help="measured steps (default: 10)")
    r.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate (default: 2e-5, a fine-tuning rate)")
    r.add_argument("--seed", type=nonnegative_int, default=0, help="seed for weights and data (default: 0)")
    r.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is available")
    r.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the configuration and results here")
    args = p.parse_args(argv)
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error("--lr must be a positive number")
    return args


def build_model(torch: Any, args: argparse.Namespace) -> Any:
    nn = torch.nn

    class Encoder(nn.Module):
        """BERT's shape: embeddings, post-LN encoder layers, a classifier on the first token."""

        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, args.d_model)
            self.positions = nn.Embedding(512, args.d_model)
            self.norm = nn.LayerNorm(args.d_model)
            layer = nn.TransformerEncoderLayer(args.d_model, args.heads, args.d_ff, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=False)
            self.layers = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.classify = nn.Linear(args.d_model, 2)

        def forward(self, ids: Any) -> Any:
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.norm(self.tokens(ids) + self.positions(pos))
            return self.classify(self.layers(x)[:, 0])

    return Encoder()


def set_tf32(torch: Any, on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def underflow_count(torch: Any, model: Any, reference: dict[str, Any]) -> tuple[int, int]:
    """(gradient elements exactly zero here but not in the FP32 reference, elements compared)."""
    lost = total = 0
    for name, p in model.named_parameters():
        if p.grad is None or name not in reference:
            continue
        ref = reference[name]
        lost += int(((p.grad == 0) & (ref != 0)).sum())
        total += ref.numel()
    return lost, total


def run(args: argparse.Namespace, device: str) -> dict[str, Any]:
    torch = require_torch("mixed_precision.py")
    gpu = device == "cuda"
    torch.manual_seed(args.seed)
    model = build_model(torch, args).to(device)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, VOCAB, (args.batch_size, args.seq_len), generator=g).to(device)
    labels = (ids[:, 1] % 2).long()  # a rule the model can learn: the parity of the second token

    # The FP32 reference gradient of the first step, from the same weights and batch.
    set_tf32(torch, False)
    model.zero_grad(set_to_none=True)
    reference_loss = torch.nn.functional.cross_entropy(model(ids), labels)
    reference_loss.backward()
    reference = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    set_tf32(torch, args.mode == "tf32")
    dtype = {"fp16": torch.float16, "fp16-noscaler": torch.float16, "bf16": torch.bfloat16}.get(args.mode)
    scaler = torch.amp.GradScaler(device) if args.mode == "fp16" else None
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def timer() -> Any:
        return torch.cuda.Event(enable_timing=True) if gpu else None

    def stamp(ev: Any) -> None:
        if ev is not None:
            ev.record()

    steps: list[dict[str, Any]] = []
    first_underflow: tuple[int, int] | None = None
    total = args.warmup + args.steps
    for i in range(total):
        measured = i >= args.warmup
        name = f"step_{i - args.warmup}" if measured else f"warmup_step_{i}"
        marks = [timer() for _ in range(4)]
        with annotate(name):
            stamp(marks[0])
            with annotate("forward"), torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(ids), labels)
            stamp(marks[1])
            with annotate("backward"):
                (scaler.scale(loss) if scaler else loss).backward()
            stamp(marks[2])
            if first_underflow is None:
                first_underflow = underflow_count(torch, model, reference)
            with annotate("optimizer_step"):
                skipped = False
                if scaler:
                    before = scaler.get_scale()
                    scaler.step(opt)
                    scaler.update()
                    skipped = scaler.get_scale() < before  # the scaler lowers its scale when it skips a step
                else:
                    opt.step()
                opt.zero_grad(set_to_none=True)
            stamp(marks[3])
        if gpu:
            torch.cuda.synchronize()
        row = {"step": i, "measured": measured, "loss": float(loss.detach().float()),
               "scale": float(scaler.get_scale()) if scaler else None, "skipped": skipped}
        if gpu:
            row.update(forward_ms=marks[0].elapsed_time(marks[1]), backward_ms=marks[1].elapsed_time(marks[2]),
                       optimizer_ms=marks[2].elapsed_time(marks[3]), step_ms=marks[0].elapsed_time(marks[3]))
        steps.append(row)
        print(f"  {name}: loss {row['loss']:.4f}" + (f", {row['step_ms']:.2f} ms" if gpu else "")
              + (f", scale {row['scale']:g}" + (" (step skipped)" if skipped else "") if scaler else ""), flush=True)
    lost, compared = first_underflow or (0, 0)
    out: dict[str, Any] = {"mode": args.mode, "device": device, "steps": steps, "underflowed_grad_elements": lost,
                           "reference_loss": float(reference_loss.detach()),
                           "grad_elements": compared, "parameters": sum(p.numel() for p in model.parameters())}
    if gpu:
        out["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated())
        out["step_ms_median"] = statistics.median(s["step_ms"] for s in steps if s["measured"])
    return out


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("mixed_precision.py", args.cpu)
    gpu = device == "cuda"
    where = where if gpu else "the CPU (no timings: for checking the script)"
    print(f"mixed_precision: {args.mode}, {args.layers} layers of {args.d_model} ({args.heads} heads, d_ff {args.d_ff}), "
          f"batch {args.batch_size} x {args.seq_len} tokens, on {where}", flush=True)
    if gpu and args.mode == "bf16" and not torch.cuda.is_bf16_supported():
        raise GpuprofError(f"{where} has no bf16 arithmetic.", "Choose another --mode (bf16 needs compute capability 8.0 or newer).")
    params = 12 * args.layers * args.d_model ** 2 + (VOCAB + 512) * args.d_model  # the encoder's weights, about
    activations = args.batch_size * args.seq_len * args.layers * (16 * args.d_model + 2 * args.d_ff) * 4
    require_memory(16 * params + activations, device, f"{args.layers} layers of {args.d_model:,} at batch "
                   f"{args.batch_size:,} x {args.seq_len:,} (weights, AdamW's state, activations)",
                   "--layers, --d-model, --d-ff, --batch-size or --seq-len", lower_bound=True)
    result = run(args, device)
    losses = [s["loss"] for s in result["steps"]]
    if not all(math.isfinite(v) for v in losses):
        raise GpuprofError(f"{args.mode}: a loss that is not finite ({losses}).", "The run diverged: see the scale column.")
    first, ref = losses[0], result["reference_loss"]
    if abs(first - ref) > 0.05 * abs(ref):
        raise GpuprofError(f"{args.mode}: the first step's loss {first:.4f} is not within 5% of the FP32 reference's "
                           f"{ref:.4f} from the same weights and batch.")
    share = result["underflowed_grad_elements"] / max(result["grad_elements"], 1)
    print(f"first step: {result['underflowed_grad_elements']:,} of {result['grad_elements']:,} gradient elements "
          f"({share:.2%}) are zero here but not in the FP32 reference (underflow)")
    print(f"result checked: every loss finite; the first step's loss {first:.4f} within 5% of the FP32 reference's {ref:.4f}")
    if args.json:
        from gpuprof.kernels import write_json

        write_json(args.json, {"config": {k: v for k, v in vars(args).items() if k != "json"}, "torch": torch.__version__,
                               "gpu": where, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
