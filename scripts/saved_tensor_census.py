#!/usr/bin/env python3
"""Count, tensor by tensor, what the chapter 7 transformer's forward pass saves for backward, on a GPU.

Chapter 7 fits what forward leaves allocated for backward at 37-38.6 bytes per token, per layer
and per unit of width (bf16 autocast); the standard accounting (Korthikanti et al. 2022, Eq. 1)
predicts 38 from a list of tensors (review 2, item 27). This script builds the benchmark's own
model (examples/nsys/transformer_benchmark.py's build_model), runs one forward and loss as its
training step does, and lists every tensor autograd saved, deduplicated by storage and given a
role (gpuprof.studies.saved_tensors.saved_tensor_census): per role, the bytes per token, per
layer and per unit of width, beside the reviewer's count; the same with each block under
torch.utils.checkpoint (use_reentrant=False); and, on CUDA, the memory forward left allocated
(torch.cuda.memory_allocated after forward less before), beside the census's bytes.

The numbers are CUDA's: autocast's op lists (which ops run in bf16, which in fp32) and the
attention kernel (and what it saves) differ on the CPU. Without a GPU it refuses (exit 2) unless
--device cpu is given. Each configuration is one untimed training step (what the first step
allocates once is not forward's) and one counted forward, in this process.

  python scripts/saved_tensor_census.py --json /tmp/saved_tensors.json
  GPUPROF_OUTPUT_DIR=artifacts GPUPROF_OVERWRITE=1 python scripts/saved_tensor_census.py --record
      (the chapter's record: artifacts/ch07/saved_tensors.json and its entry in artifacts/ch07/provenance.json)
  python scripts/saved_tensor_census.py --device cpu --sizes tiny --contexts 16,32 --mode fp32
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.cli import output_file, positive_int  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

ENTRIES = {"first-layer": "first layer", "all": "all", "none": "none"}
CHECKPOINT = {"both": (False, True), "off": (False,), "on": (True,)}
RECORD = ("ch07", "saved_tensors.json")  # the chapter's record, as --record saves it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from gpuprof.studies.saved_tensors import MODES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="small,medium",
                   help="comma-separated sizes of the benchmark's table (tiny, small, medium, large, xl, 2.7B) "
                        "(default: small,medium)")
    p.add_argument("--contexts", default="256,512", help="comma-separated context lengths (default: 256,512)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="sequences per step (default: 4, the sweep's)")
    p.add_argument("--mode", choices=MODES, default="bf16", help="fp32 (no autocast) or bf16 (the benchmark's "
                   "autocast) (default: bf16)")
    p.add_argument("--checkpoint", choices=list(CHECKPOINT), default="both",
                   help="each block under torch.utils.checkpoint: off, on, or both (default: both)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="default: cuda")
    p.add_argument("--entries", choices=list(ENTRIES), default="first-layer",
                   help="saved tensors kept in --json: layer 0's and the model's own (first-layer), all, or none "
                        "(default: first-layer; the per-role totals are always kept)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write every run's census here")
    p.add_argument("--record", action="store_true",
                   help=f"also save it as {RECORD[0]}/{RECORD[1]} in this machine's capture folder (GPUPROF_OUTPUT_DIR, "
                        "default captures/) with a provenance entry, as the chapter's other records "
                        "(GPUPROF_OVERWRITE=1 replaces an earlier one)")
    args = p.parse_args(argv)
    from gpuprof.runner import load_script
    from gpuprof.studies.saved_tensors import BENCHMARK

    presets = load_script(BENCHMARK).PRESETS
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for s in args.sizes:
        if s not in presets:
            p.error(f"size {s!r} is not in the benchmark's table ({', '.join(presets)})")
    try:
        args.contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        p.error(f"--contexts {args.contexts!r} is not a comma-separated list of whole numbers")
    if not args.contexts or min(args.contexts) < 1:
        p.error("--contexts: give one or more lengths, each at least 1")
    if not args.sizes:
        p.error("--sizes: give one or more sizes")
    return args


def slopes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size and checkpoint setting, the census's bytes (and CUDA's allocated bytes) per added token, per layer and
    per unit of width between the shortest and the longest context: the same slope the chapter's fit measures."""
    out = []
    keys = dict.fromkeys((r["config"]["size"], r["checkpoint"]) for r in records)
    for size, ckpt in keys:
        runs = sorted((r for r in records if r["config"]["size"] == size and r["checkpoint"] == ckpt),
                      key=lambda r: r["context"])
        if len(runs) < 2:
            continue
        lo, hi = runs[0], runs[-1]
        norm = (hi["batch"] * hi["context"] - lo["batch"] * lo["context"]) * hi["config"]["num_layers"] * \
            hi["config"]["d_model"]
        row = {"size": size, "checkpoint": ckpt, "contexts": [lo["context"], hi["context"]],
               "census_slope": (hi["summary"]["activation_bytes"] - lo["summary"]["activation_bytes"]) / norm}
        if "cuda_memory" in hi["summary"]:
            row["allocated_slope"] = (hi["summary"]["cuda_memory"]["allocated_by_forward"]
                                      - lo["summary"]["cuda_memory"]["allocated_by_forward"]) / norm
        out.append(row)
    return out


def show(census: Any) -> None:
    cols = ["saved tensors", "storages", "bytes per token-layer-width", "reviewer", "note"]
    table = census.roles[cols].copy()
    table["reviewer"] = table["reviewer"].map(lambda v: "" if v != v or v is None else f"{v:g}")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    s = census.summary
    print(f"  attention kernel's node: {', '.join(s['attention_nodes']) or 'none'}; {s['held_by_checkpoint']} fields "
          f"held by checkpoint; {s['saved_then_freed']} saved then freed in forward")
    if "cuda_memory" in s:
        m = s["cuda_memory"]
        print(f"  CUDA: forward left {m['allocated_by_forward']:,} B allocated; the census counts "
              f"{m['census_new_cuda_storages']:,} B (the saved storages forward allocated on the GPU: activations and "
              f"weight copies); difference {m['difference']:,} B")


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpuprof.backend import require_torch

    torch = require_torch("saved_tensor_census.py")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise GpuprofError("no CUDA GPU here: the census's numbers are CUDA's (autocast's op lists and the attention "
                           "kernel, and what it saves, differ on the CPU); run it on a GPU, or pass --device cpu to "
                           "count what the CPU saves.")
    from gpuprof.studies.saved_tensors import benchmark_config, saved_tensor_census

    where = torch.cuda.get_device_name() if args.device == "cuda" else "the CPU"
    print(f"saved-tensor census: sizes {', '.join(args.sizes)}, contexts {args.contexts}, batch {args.batch_size}, "
          f"{args.mode}, on {where} (torch {torch.__version__})", flush=True)
    records = []
    for size in args.sizes:
        for context in args.contexts:
            for ckpt in CHECKPOINT[args.checkpoint]:
                cfg = benchmark_config(size, context, args.batch_size, args.mode)
                census = saved_tensor_census(cfg, args.device, args.mode, checkpoint=ckpt)
                print(f"\n{size}, context {context}, batch {args.batch_size}, {args.mode}"
                      f"{', each block checkpointed' if ckpt else ''}:")
                show(census)
                records.append(census.record(ENTRIES[args.entries]))
                del census
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                if args.json:  # after every configuration: a run that fails later keeps what it finished
                    write_json(args.json, payload(records, torch, where, argv))
    fits = slopes(records)
    if fits:
        print("\nslope between the shortest and longest context, bytes per token, per layer and per unit of width:")
        for f in fits:
            extra = f", CUDA allocated {f['allocated_slope']:.3f}" if "allocated_slope" in f else ""
            print(f"  {f['size']}{' checkpointed' if f['checkpoint'] else ''}: census {f['census_slope']:.3f}{extra}")
    if args.json or args.record:
        from gpuprof.artifacts import overwrite_allowed, save_json

        final = {**payload(records, torch, where, argv), "complete": True}
        if args.json:
            write_json(args.json, final)
            print(f"written to {args.json}")
        if args.record:
            print(f"recorded as {save_json(*RECORD, final, command=final['command'], overwrite=overwrite_allowed())}")
    return 0


def payload(records: list[dict[str, Any]], torch: Any, where: str, argv: list[str] | None) -> dict[str, Any]:
    """The record: machine, versions, commit, command, the slopes over the runs so far and the runs.
    ``complete`` is False until every configuration has run (the file is rewritten after each)."""
    from gpuprof.artifacts import git_commit
    from gpuprof.backend import describe_machine

    command = "python scripts/saved_tensor_census.py " + " ".join(sys.argv[1:] if argv is None else argv)
    return {"machine": describe_machine().as_dict(), "gpu": where, "torch": torch.__version__, "commit": git_commit(),
            "command": command, "slopes": slopes(records), "runs": records, "complete": False,
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Strict JSON (no NaN: a reader other than Python's would refuse it)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
