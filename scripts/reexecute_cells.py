#!/usr/bin/env python3
"""Re-execute chosen cells of a committed notebook here, keeping every other cell's stored output.

The book shows outputs from a GPU run. When a change touches only cells that *analyse* the
committed captures (a table read from a report, a figure redrawn from a sqlite export, a
check on a JSON of timings), those cells compute the same thing on any machine from the
same files, so they can be re-executed on a CPU without a new GPU run. This script executes
a scratch copy of the whole notebook on this machine (without a GPU every capture cell
falls back to the reference captures in artifacts/), then copies the outputs of the cells
named by ``--cells`` (their ids) into the committed notebook and leaves all other cells
exactly as they were.

It refuses a cell whose new output names the reference fallback ("the course's reference"):
such a cell reports where its data came from, which differs between a GPU run and this one.
Record what was re-executed in artifacts/capture_run.md.

With ``--context`` only the context cells (a chapter's imports, say) and the named cells run,
in the notebook's order, and nothing else: that is how new cells that make a capture of
their own get their outputs from a GPU without re-running the chapter's other captures
(run it on the GPU machine, with ``GPUPROF_OUTPUT_DIR=artifacts`` so that the capture
becomes the reference the cells read). The named cells must then need nothing from the
cells left out.

  python scripts/reexecute_cells.py notebooks/04__nsight_compute.ipynb --cells 91db783c,4f2a11d0
  python scripts/reexecute_cells.py notebooks/06__cnn_training.ipynb --context 40a7e82d --cells c6tf32r1,c6tf32t1
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuprof import exit_on_error  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

FALLBACK_WORDS = ("the course's reference", "No GPU on this machine")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebook", type=Path, help="the committed notebook, changed in place")
    p.add_argument("--cells", required=True, help="comma-separated ids of the cells whose outputs are replaced")
    p.add_argument("--context", default="", help="comma-separated ids of cells to run first (imports); with it, "
                   "no other cell runs")
    p.add_argument("--timeout", type=int, default=600, help="seconds each cell may take (default: 600)")
    return p.parse_args(argv)


def text_of(outputs: list) -> str:  # type: ignore[type-arg]
    parts = []
    for out in outputs:
        parts.append("".join(out.get("text", "")))
        parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    import nbformat
    from nbclient import NotebookClient

    args = parse_args(argv)
    if not args.notebook.is_file():
        raise GpuprofError(f"{args.notebook} is not a notebook file.")
    wanted = [c.strip() for c in args.cells.split(",") if c.strip()]
    context = [c.strip() for c in args.context.split(",") if c.strip()]
    nb = nbformat.read(args.notebook, as_version=4)
    by_id = {c.get("id"): c for c in nb.cells}
    unknown = [c for c in wanted + context if c not in by_id]
    if unknown:
        raise GpuprofError(f"no cell with id {', '.join(unknown)} in {args.notebook}.")
    if any(by_id[c].cell_type != "code" for c in wanted):
        raise GpuprofError("only code cells have outputs to replace.")
    scratch = copy.deepcopy(nb)
    if context:
        keep = set(context) | set(wanted)
        scratch.cells = [c for c in scratch.cells if c.get("id") in keep and c.cell_type == "code"]
    print(f"executing a copy of {args.notebook.name} here" + (f" (only {len(scratch.cells)} cells)" if context else "")
          + " ...", flush=True)
    NotebookClient(scratch, timeout=args.timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(args.notebook.parent)}}).execute()
    fresh = {c.get("id"): c for c in scratch.cells}
    for cid in wanted:
        outputs = fresh[cid].outputs
        if any(word in text_of(outputs) for word in FALLBACK_WORDS):
            raise GpuprofError(f"cell {cid} reports a reference fallback: its output would differ from a GPU run's.",
                               "Re-execute only cells that analyse the captures.")
        if any(o.get("output_type") == "error" for o in outputs):
            raise GpuprofError(f"cell {cid} failed here: {text_of(outputs)[-300:]}")
        by_id[cid].outputs = outputs
        by_id[cid].execution_count = fresh[cid].get("execution_count")
        print(f"  cell {cid}: {len(outputs)} output(s) replaced")
    from capture_all import shrink_figures  # beside this script: figures stored as a capture run stores them

    shrink_figures(SimpleNamespace(cells=[by_id[cid] for cid in wanted]))  # only the replaced cells' figures
    nbformat.write(nb, args.notebook)
    print(f"{args.notebook}: {len(wanted)} cell(s) re-executed; every other cell keeps its stored output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
