#!/usr/bin/env python3
"""How DDP groups a model's gradients into all-reduce buckets, for each bucket_cap_mb.

DDP all-reduces gradients bucket by bucket, and a bucket goes as soon as all of its
gradients are ready. Which gradients share a bucket is decided in two stages, which this
script shows for ``ddp_training.py``'s model (the layout depends on the parameters' sizes
and order alone, not on the device, so it runs on the CPU):

* the first step runs with ONE bucket holding every gradient (DDP's initial layout unless
  find_unused_parameters=True without static_graph: it does not yet know the order backward
  produces the gradients in): nothing is all-reduced until backward has finished, one more
  reason to leave the first steps out of a timing;
* from the second step on, DDP rebuilds its buckets in the order the gradients became
  ready in the first backward (the last layer's first), filling each up to the cap.

``bucket_cap_mb`` (in MiB, whatever its name says) left unset is DDP's default: 25 MiB
buckets, but the FIRST bucket capped at 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``),
so that the first all-reduce can start early. Any value given explicitly, 25 included,
applies to the first bucket too. ``--bucket-mb default`` asks for DDP's own default here;
``ddp_training.py --default-buckets`` trains with it, and ``ddp_knobs.py``'s ``default-buckets``
variant times it against 25 given.

A bucket closes once it holds at least the cap, so a parameter larger than the cap (here
each layer's 16 MiB weight against a 1 MiB cap) gets a bucket of its own.

Examples:
  python examples/nsys/ddp_buckets.py                     # default, 25, 100 and 1000 MiB
  python examples/nsys/ddp_buckets.py --bucket-mb default,25 --width 1024 --depth 8
  python examples/nsys/ddp_buckets.py --json layout.json

One process (world size 1, gloo on the CPU): DDP builds and rebuilds its buckets as it would
on any number of GPUs, with nothing to all-reduce with.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the repo
sys.path.insert(0, str(Path(__file__).resolve().parent))  # ddp_training.py, beside this file

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.backend import require_torch  # noqa: E402
from gpuprof.cli import output_file, positive_float, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

import ddp_training  # noqa: E402

MIB = 2**20
STEPS = 3  # DDP rebuilds its buckets before the second step's forward; a third step shows the layout stays


def cap_list(text: str) -> list[float | None]:
    """argparse type: bucket caps in MiB separated by commas; ``default`` is DDP's own (None)."""
    caps: list[float | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part == "default":
            caps.append(None)
            continue
        try:
            caps.append(positive_float(part))
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"a bucket cap is a number of MiB or 'default': {e}") from None
    if len(set(caps)) != len(caps):
        raise argparse.ArgumentTypeError(f"a bucket cap is named twice in {text!r}")
    return caps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bucket-mb", type=cap_list, default=cap_list("default,25,100,1000"), metavar="MB[,MB...]",
                   help="DDP bucket_cap_mb values, 'default' for none given (default: default,25,100,1000)")
    p.add_argument("--width", type=positive_int, default=ddp_training.GPU_SIZES["width"],
                   help="features of every layer (default: ddp_training.py's on a GPU, %(default)s)")
    p.add_argument("--depth", type=positive_int, default=ddp_training.GPU_SIZES["depth"],
                   help="linear layers (default: ddp_training.py's on a GPU, %(default)s)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write the layouts to FILE")
    return p.parse_args(argv)


def sizes_in_words(sizes: list[int]) -> str:
    """Bucket sizes in order, runs of equal sizes folded: '16 MiB, 15 x 32 MiB, 16 MiB'."""
    words: list[str] = []
    i = 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        size = f"{sizes[i] / MIB:.3g} MiB"
        words.append(size if j - i == 1 else f"{j - i} x {size}")
        i = j
    return ", ".join(words)


def layout(torch: Any, model_args: argparse.Namespace, cap_mb: float | None) -> dict[str, Any]:
    """Wrap a fresh model in DDP with this cap, run STEPS tiny steps, and record every bucket it all-reduces.

    A communication hook sees each bucket as DDP hands it over, so the layout is observed, not read from
    DDP's settings: per step, the buckets' sizes in the order they were all-reduced. DDP's own record of its
    rebuilt layout (its logging data) must agree, and is checked.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = ddp_training.build_model(model_args, torch, "cpu")
    ddp = DDP(model, **({} if cap_mb is None else {"bucket_cap_mb": cap_mb}))
    seen: list[int] = []

    def recording_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects a hook annotated otherwise than
        # (object, dist.GradBucket) -> Future[Tensor], and this module's annotations are strings
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, recording_hook)
    x = torch.randn(2, model_args.width)
    steps: list[list[int]] = []
    for _ in range(STEPS):
        seen.clear()
        ddp(x).sum().backward()
        model.zero_grad(set_to_none=True)
        steps.append(list(seen))
    rebuilt = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes")
    if rebuilt and sorted(int(b) for b in str(rebuilt).split(",")) != sorted(steps[-1]):
        raise GpuprofError(f"DDP's record of its buckets ({rebuilt}) disagrees with the buckets it all-reduced "
                           f"({steps[-1]}) in torch {torch.__version__}.")
    del ddp, model
    return {"bucket_cap_mb": cap_mb, "steps": steps, "ddp_record": bool(rebuilt)}


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch("ddp_buckets.py")
    import torch.distributed as dist

    from gpuprof.models import require_training_memory

    model_args = argparse.Namespace(width=args.width, depth=args.depth)
    # parameters, their gradients and DDP's bucket copy of them; activations of a batch of 2 are negligible
    require_training_memory(lambda: ddp_training.build_model(model_args, torch, None), (args.width,), 2, "cpu",
                            "--width or --depth", optimizer_states=1)
    grad_bytes = ddp_training.gradient_bytes(model_args)
    print(f"ddp_buckets: {args.depth} layers of {args.width} ({grad_bytes / MIB:.0f} MiB of FP32 gradients), "
          f"torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:  # a file rendezvous: no port to collide with
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rendezvous')}", rank=0, world_size=1)
        try:
            rows = [layout(torch, model_args, cap) for cap in args.bucket_mb]
        finally:
            dist.destroy_process_group()
    for row in rows:
        wrong = [i + 1 for i, step in enumerate(row["steps"]) if sum(step) != grad_bytes]
        if wrong:
            raise GpuprofError(f"bucket_cap_mb {row['bucket_cap_mb']}: the buckets of step(s) {wrong} do not add up to the "
                               f"model's {grad_bytes:,} bytes of gradients (torch {torch.__version__}).")
    for row in rows:
        cap = "not given (default)" if row["bucket_cap_mb"] is None else f"{row['bucket_cap_mb']:g}"
        first, *later = row["steps"]
        print(f"  bucket_cap_mb {cap}:", flush=True)
        print(f"    step 1: {len(first)} bucket(s): {sizes_in_words(first)}", flush=True)
        for i, step in enumerate(later, start=2):
            same = i > 2 and step == later[0]
            print(f"    step {i}: " + ("the same" if same else f"{len(step)} bucket(s), in the order all-reduced: "
                                                              f"{sizes_in_words(step)}"), flush=True)
    print(f"  result checked: in every step the buckets add up to the model's gradients, and the hook saw the buckets "
          f"DDP records as its rebuilt ones{'' if all(r['ddp_record'] for r in rows) else ' (where DDP kept a record)'}",
          flush=True)
    if args.json is not None:
        import json

        args.json.write_text(json.dumps({"torch": torch.__version__, "width": args.width, "depth": args.depth,
                                         "gradient_bytes": grad_bytes, "layouts": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
