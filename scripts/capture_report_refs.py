#!/usr/bin/env python3
"""Regenerate ``artifacts/report/``: the captures the "Your own captures" chapter reads, on a GPU.

Two nsys captures of chapter 6's training loop (the naive loop and a fast rung), each
with the ``nsys stats`` reports whose numbers ``python -m gpuprof report`` must equal
(``cuda_gpu_kern_sum``, ``nvtx_kern_sum``, ``nvtx_sum``, ``cuda_api_sum``,
``cuda_gpu_mem_time_sum``); then Nsight Systems' own recipes (``nsys recipe``) over the
same reports, their tables saved as CSV, so the chapter can set each recipe beside the
gpuprof measure that computes the same thing. A recipe that cannot run (its Python
packages missing) is recorded as such, with nsys's message, not skipped silently.

Usage (on the GPU machine, from the repository root, about 80 s on an H100):
``GPUPROF_OUTPUT_DIR=artifacts python scripts/capture_report_refs.py``. The ``.nsys-rep``
files and the recipes' own folders stay out of git (``.gitignore``; ``recipe_*/``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.artifacts import chapter_output, record_file  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

CHAPTER = "report"
STATS = ["cuda_gpu_kern_sum", "nvtx_kern_sum", "nvtx_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum"]
# recipes over one report each (then diff over two outputs of cuda_gpu_kern_sum)
RECIPES = ["cuda_gpu_kern_sum", "gpu_gaps", "gpu_time_util", "nvtx_gpu_proj_sum", "cuda_api_sum"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-capture", action="store_true", help="reuse the .nsys-rep files already in the output folder")
    return p.parse_args(argv)


def capture(name: str, levers: tuple[str, ...]) -> Path:
    from gpuprof.nsys.capture import QUIET, nsys_capture
    from gpuprof.studies.cnn_training import SCRIPT

    args = [*levers, "--warmup", "10", "--steps", "20", "--repeats", "1", "--profile-steps", "20",
            "--dataset-size", "10000"]
    cap = nsys_capture(CHAPTER, name, SCRIPT, args, reports=STATS,
                       options=[*QUIET, "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                                "--cuda-graph-trace=node"])
    if cap.sqlite.source != "this machine":
        raise GpuprofError(f"the live capture of {name} did not happen.", "Run this on a GPU machine with nsys.")
    return chapter_output(CHAPTER) / f"{name}.nsys-rep"


def run_recipe(nsys: str, recipe: str, inputs: list[Path], target: Path, *extra: str) -> dict:
    """``nsys recipe RECIPE --input ... --output TARGET --mode none``; its Parquet tables are also written as CSV.

    ``--mode none`` runs sequentially: the other modes need Dask, which the recipes' own
    requirements list as optional (common.txt asks only for numpy, pandas, psutil, pyarrow).
    """
    out = target.parent
    shutil.rmtree(target, ignore_errors=True)
    cmd = [nsys, "recipe", recipe, "--input", *map(str, inputs), "--output", str(target), "--mode", "none", *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    entry = {"command": " ".join(["nsys", *cmd[1:]]).replace(str(out) + "/", ""), "rc": r.returncode,
             "seconds": round(time.perf_counter() - t0, 1), "output": (r.stdout + r.stderr)[-3000:]}
    if r.returncode != 0:
        print(f"  recipe {recipe}: failed (rc {r.returncode}): {entry['output'][-300:]}")
        return entry
    import pandas as pd

    for f in sorted(target.rglob("*.parquet")):
        table = pd.read_parquet(f)  # the recipes keep the key (kernel name, range) in the index
        table.to_csv(f.with_suffix(".csv"), index=not isinstance(table.index, pd.RangeIndex))
    entry["files"] = sorted(str(f.relative_to(out)) for f in target.rglob("*") if f.is_file())
    # Keep the recipe's main table (all_stats, or analysis for gpu_time_util) as <target>.csv beside the
    # reports; the folder (Parquet, notebooks, a copy of the recipe's code) is not committed.
    main = next((target / f"{t}.csv" for t in ("all_stats", "analysis") if (target / f"{t}.csv").exists()), None)
    if main is not None:
        shutil.copy(main, out / f"{target.name}.csv")
        record_file(CHAPTER, f"{target.name}.csv", entry["command"] + f"  (its {main.stem} table, Parquet written as CSV)", {})
    print(f"  recipe {recipe} on {', '.join(p.name for p in inputs)}: {len(entry['files'])} file(s), {entry['seconds']} s")
    return entry


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpuprof.tools import find_tool

    nsys = str(find_tool("nsys").path)
    out = chapter_output(CHAPTER)
    if args.skip_capture:
        reports = sorted(out.glob("*.nsys-rep"))
    else:
        print("[1/2] nsys over 20 steps of chapter 6's loop, twice: the naive loop, then a fast rung")
        reports = [capture("naive", ()), capture("fast", ("--data-on-gpu", "--loss-every", "50", "--cuda-graphs",
                                                          "--fused-adam", "--bf16", "--channels-last",
                                                          "--cudnn-benchmark"))]
    print(f"[2/2] nsys recipe over {', '.join(p.name for p in reports)}")
    results: dict[str, dict] = {}
    for recipe in RECIPES:
        for rep in reports:
            results[f"{recipe}_{rep.stem}"] = run_recipe(nsys, recipe, [rep], out / f"recipe_{recipe}_{rep.stem}")
    # diff compares two outputs of one statistical recipe (not two reports)
    pair = [out / f"recipe_cuda_gpu_kern_sum_{rep.stem}" for rep in reports]
    results["diff"] = run_recipe(nsys, "diff", pair, out / "recipe_diff", "--csv")
    for entry in results.values():  # what nsys printed, shortened: the tables themselves are in the CSVs
        entry["output"] = entry.get("output", "")[-600:]
        entry["files"] = [f for f in entry.get("files", []) if f.endswith(".csv")]
    (out / "recipes.json").write_text(json.dumps(results, indent=1) + "\n")
    record_file(CHAPTER, "recipes.json", "python scripts/capture_report_refs.py", {})
    for rep in reports:
        print(f"  kept {rep.with_suffix('.sqlite').name}; {rep.name} is not committed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
