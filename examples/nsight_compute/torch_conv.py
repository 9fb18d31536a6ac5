#!/usr/bin/env python3
"""A small PyTorch convolution network stepped a few times: what ncu meets in a framework program.

Unlike the hand-written kernels beside it, this program launches kernels it did not
name: cuDNN convolutions, cuBLAS products, PyTorch's elementwise kernels. With
--benchmark, ``torch.backends.cudnn.benchmark = True`` makes cuDNN time several
algorithms for each new convolution shape during the first step, and every one of those
trial kernels is a launch that ncu profiles (and replays) like any other. The first step
runs inside an NVTX range ``first_step``, the others inside ``step_N``, so that

  ncu --nvtx --nvtx-include "step_2/" --set basic -o conv python examples/nsight_compute/torch_conv.py --benchmark

profiles one steady-state step and nothing else.

Without a GPU it runs on the CPU (PyTorch's CPU build), and there is nothing for ncu to profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo

from gpuprof import annotate, exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402
from gpuprof.models import require_training_memory  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=3, help="training steps, the first one in first_step (default: 3; at least 2)")
    p.add_argument("--batch", type=positive_int, default=32, help="images per step (default: 32)")
    p.add_argument("--benchmark", action="store_true", help="set torch.backends.cudnn.benchmark = True")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the loss per step to FILE")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2: the loss of a later step is compared with the first")
    return args


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("torch_conv.py")
    from torch import nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = args.benchmark
    def build() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(128, 10))

    require_training_memory(build, (3, 32, 32), args.batch, device, "--batch", optimizer_states=0)  # plain SGD
    torch.manual_seed(0)
    model = build().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    print(f"torch_conv: {args.steps} steps of batch {args.batch} on {device}, cudnn.benchmark={args.benchmark}"
          + ("" if device == "cuda" else " (no GPU: nothing for ncu to profile)"))
    losses = []
    for step in range(args.steps):
        with annotate("first_step" if step == 0 else f"step_{step}"):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())  # reads the loss back: the step's kernels finish inside its range
    print("loss per step: " + ", ".join(f"{v:.4f}" for v in losses))
    if not losses[-1] < losses[0]:
        raise GpuprofError(f"the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f}): the training step is broken.")
    print("result checked: the loss fell")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"device": device, "benchmark": args.benchmark, "loss": losses}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
