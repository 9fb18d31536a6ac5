#!/usr/bin/env python3
"""One matrix product of the mixed-precision chapter's model in BF16 and in FP8 with per-tensor scales.

FP8 (E4M3: 4 exponent bits, 3 mantissa bits, largest finite value 448) holds so narrow a range
that every tensor is multiplied by a scale of its own before it is rounded: here the simplest
rule, the tensor's absolute maximum mapped to 448 ("current" scaling; NVIDIA's Transformer
Engine uses the maxima of recent steps instead, "delayed" scaling). The product runs through
``torch._scaled_mm`` (a private PyTorch API: its arguments may change between versions), which
takes both FP8 operands, their dequantisation scales and the output type.

What it reports:
  * accuracy, on any device: the relative error (Frobenius norm) of the BF16 and of the FP8
    product against an FP32 product of the same inputs;
  * speed, on a GPU with FP8 tensor cores (compute capability 8.9 or later: Ada, Hopper): the
    time of each product with CUDA events (--repeats back-to-back products between two events,
    the median of 5 such trials, after a warm-up) and its rate,
    inside NVTX ranges ``bf16_matmul`` and ``fp8_matmul`` for Nsight Systems. The FP8 time
    excludes the quantisation of the inputs (in training it is a few elementwise kernels per
    product, which a real run must count too). Unless --no-clocks, NVML's SM clock, power (with
    the enforced limit) and clock-event reasons during each precision's timed trials, read by a
    thread every 20 ms (gpuprof.nvml): FP8 draws more power per product, and a capped clock would
    shrink its gain. At the default --repeats a precision's trials last milliseconds, fewer than the
    readings a clock needs; the script says so and --repeats 2000 gives them about half a second.

The default shape is the chapter's first feed-forward product at batch 32: 32 x 128 tokens, 768 in,
3,072 out. On the CPU, or on an older GPU, only the accuracy is computed ("no FP8 timing here").

Examples:
  python examples/nsys/fp8_matmul.py
  python examples/nsys/fp8_matmul.py --m 16384 --json fp8.json
  nsys profile --trace=cuda,nvtx -o fp8 python examples/nsys/fp8_matmul.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import torch_device  # noqa: E402
from gpuprof.cli import output_file, positive_int, require_memory  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.nvml import describe_window, torch_sampler  # noqa: E402
from gpuprof.ranges import annotate  # noqa: E402
from gpuprof.timing import time_call  # noqa: E402

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn (OCP FP8 specification)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=positive_int, default=4096, help="rows of A: tokens (default: 4096 = 32 x 128)")
    p.add_argument("--k", type=positive_int, default=768, help="inner dimension (default: 768)")
    p.add_argument("--n", type=positive_int, default=3072, help="columns of the product (default: 3072)")
    p.add_argument("--repeats", type=positive_int, default=50, help="back-to-back products per timed trial, 5 trials per precision (default: 50)")
    p.add_argument("--seed", type=int, default=0, help="seed for the inputs (default: 0)")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even where a GPU is available")
    p.add_argument("--no-clocks", action="store_true",
                   help="do not read the SM clock, power and clock-event reasons from NVML during the timed trials")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the results here")
    args = p.parse_args(argv)
    for name in ("m", "k", "n"):
        if getattr(args, name) % 16:
            p.error(f"--{name} {getattr(args, name)} is not a multiple of 16 (FP8 tensor-core products need it)")
    return args


def quantize(torch: Any, x: Any) -> tuple[Any, Any]:
    """(x as float8_e4m3fn, the dequantisation scale): x / scale has its absolute maximum at E4M3's 448."""
    scale = (x.abs().amax().float() / E4M3_MAX).clamp(min=1e-12)
    return (x / scale).to(torch.float8_e4m3fn), scale


def relative_error(torch: Any, got: Any, ref: Any) -> float:
    return float(torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref))


def fp8_product(torch: Any, a8: Any, sa: Any, b8: Any, sb: Any) -> Any:
    """A @ B^T from FP8 operands: ``_scaled_mm`` wants the second operand column-major, which B^T of a row-major B is."""
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def time_ms(fn: Any, repeats: int, name: str, trials: int = 5) -> float:
    """Time of one call of ``fn`` in ms: ``gpuprof.timing.time_call`` with ``repeats`` back-to-back calls per CUDA-event
    pair (its ``inner``), the median of ``trials`` such samples, after 5 untimed calls, inside NVTX range ``name``. One
    event pair around many calls, not around each: a single product here lasts tens of microseconds, and with an
    event pair around one call the host's launch latency of that call (Python, dispatch, cuBLASLt's heuristics) would
    sit inside the timed window and pull the FP8/BF16 ratio towards 1; back to back, the next launch overlaps the
    GPU's work."""
    with annotate(name):
        return time_call(fn, warmup=5, repeats=trials, inner=repeats).median * 1e3


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, device, where = torch_device("fp8_matmul.py", args.cpu)
    m, k, n = args.m, args.k, args.n
    # FP32 inputs, reference and products, their BF16 and FP8 copies: under 16 bytes per element of A, B and C
    require_memory(16 * (m * k + n * k + m * n), device, f"a {m} x {k} by {k} x {n} product", "--m, --k or --n")
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        raise GpuprofError(f"PyTorch {torch.__version__} has no float8_e4m3fn or _scaled_mm.", "Use PyTorch 2.1 or later.")
    print(f"A {args.m} x {args.k} times B^T ({args.n} x {args.k}) on {where}")
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    a = torch.randn(args.m, args.k, generator=g).to(device)
    b = (torch.randn(args.n, args.k, generator=g) / args.k ** 0.5).to(device)
    ref = a @ b.t()  # FP32 reference (TF32 is off by default for matrix products)
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    (a8, sa), (b8, sb) = quantize(torch, a), quantize(torch, b)
    out = {"device": where, "shape": [args.m, args.k, args.n],
           "bf16_relative_error": relative_error(torch, a16 @ b16.t(), ref),
           "fp8_relative_error": relative_error(torch, fp8_product(torch, a8, sa, b8, sb), ref)}
    print(f"relative error against FP32: BF16 {out['bf16_relative_error']:.2e}, FP8 E4M3 with per-tensor scales "
          f"{out['fp8_relative_error']:.2e}")
    if not 0 < out["bf16_relative_error"] < out["fp8_relative_error"] < 0.1:
        raise GpuprofError(f"unexpected errors: BF16 {out['bf16_relative_error']:.3g}, FP8 {out['fp8_relative_error']:.3g}",
                           "FP8 should round more coarsely than BF16, and both stay within 10%.")
    if device == "cuda" and torch.cuda.get_device_capability() >= (8, 9):
        flop = 2 * args.m * args.k * args.n
        sampler, limit, how = torch_sampler(torch, True, not args.no_clocks)
        print(f"clocks: {how}")
        windows: dict[str, Any] = {}
        try:
            for p, fn in (("bf16", lambda: a16 @ b16.t()), ("fp8", lambda: fp8_product(torch, a8, sa, b8, sb))):
                t0 = time.monotonic()
                out[f"{p}_ms"] = time_ms(fn, args.repeats, f"{p}_matmul")
                if sampler is not None:
                    windows[p] = {**sampler.summary(t0, time.monotonic()), "power_limit_w": limit}
        finally:
            if sampler is not None:
                sampler.__exit__(None, None, None)
        out["nvml"] = windows or None
        if not windows:
            out["nvml_why"] = how
        for p, nv in windows.items():
            print(f"during {p}'s trials: {describe_window(nv)}"
                  + (" (too few readings for a clock: raise --repeats)" if nv["samples"] < 3 else ""))
        for p in ("bf16", "fp8"):
            out[f"{p}_tflops"] = flop / out[f"{p}_ms"] / 1e9
        out["fp8_speedup"] = out["bf16_ms"] / out["fp8_ms"]
        print(f"BF16 {out['bf16_ms']:.4f} ms ({out['bf16_tflops']:.0f} TFLOP/s), FP8 {out['fp8_ms']:.4f} ms "
              f"({out['fp8_tflops']:.0f} TFLOP/s): FP8 {out['fp8_speedup']:.2f}x BF16 (median of 5 trials of {args.repeats} products)")
    else:
        print("no FP8 timing here: it needs a CUDA GPU of compute capability 8.9 or later")
    print("result checked: FP8's error is above BF16's and under 10%")
    if args.json:
        import json

        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
