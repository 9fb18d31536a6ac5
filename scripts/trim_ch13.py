"""Make chapter 13's Nsight Systems exports small enough to bring back from the GPU machine and commit.

A rank's SQLite export of the chapter's training run is about 10 MB (two ranks) and four
ranks' do not fit what one device call returns. The chapter reads only the timed steps' kernels,
its NVTX ranges and the synchronisations that close each step's GPU window, so each export is
(1) scrubbed of the machine's environment (:func:`gpuprof.nsys.export_edit.scrub_environment`),
(2) cut to the kernels that start inside its timed steps' GPU windows
(:func:`gpuprof.studies.sharded_training.mode_steps`), with the event, overhead and diagnostic
tables dropped (:func:`gpuprof.nsys.export_edit.trim_reference`), and the memory copies, memsets,
the streams' waits on events (CUPTI's synchronization records) and the CUDA API calls (the
launches) cut to the same windows, every ``*Synchronize*`` call kept
(:func:`gpuprof.nsys.export_edit.keep_in_windows`): the chapter reads them to tell apart what
the compute stream waited for (the two-GPU references, trimmed before this, lack them), and (3) gzipped (mtime 0, so the same input
gives the same bytes). The sentence saying what was removed goes into ``--notes`` (JSON, one
entry per output file), for the provenance. The inputs are copied first and never changed.

  python scripts/trim_ch13.py out/modes_rank0.sqlite out/modes_rank1.sqlite --out ch13_4gpu --notes ch13_4gpu/trim_notes.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuprof.errors import GpuprofError, exit_on_error  # noqa: E402

DROP = ("CUPTI_ACTIVITY_KIND_CUDA_EVENT", "PROFILER_OVERHEAD", "DIAGNOSTIC_EVENT")
# kept, but only inside the timed steps' windows: what ran between the kernels, and the calls that launched them
IN_WINDOWS = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
              "CUPTI_ACTIVITY_KIND_RUNTIME")


def trim_one(src: Path, out_dir: Path, *, lean_export: bool = False) -> tuple[Path, str]:
    """Scrub, trim and gzip one rank's export into ``out_dir``; returns the written file and the trim's sentence.
    ``lean_export``: also :func:`gpuprof.nsys.export_edit.keep_only_sync_calls` (the four-GPU run's exports)."""
    from gpuprof.nsys import export_edit
    from gpuprof.nsys.ranks import rank_data
    from gpuprof.studies import sharded_training as st

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / src.name
        shutil.copy(src, work)
        export_edit.scrub_environment(work)
        data = rank_data(work, runtime=True)
        if len(data) != 1:
            raise GpuprofError(f"{src} holds {len(data)} ranks; this script trims one export per rank.")
        (d,) = data.values()
        steps = st.mode_steps(d)
        if steps.empty:
            raise GpuprofError(f"{src}: no timed step_N ranges, so nothing to keep.",
                               "Was it captured from examples/nsys/fsdp_training.py?")
        windows = [(int(a), int(b)) for a, b in zip(steps["start"], steps["end"])]
        note = export_edit.trim_reference(work, drop_tables=DROP, keep_windows=windows)
        cut = export_edit.keep_in_windows(work, IN_WINDOWS, windows, keep_calls="Synchronize")
        thin = export_edit.keep_only_sync_calls(work) if lean_export else ""
        note = "; ".join(n for n in (note, cut, thin) if n)
        out = out_dir / (src.name + ".gz")
        with open(work, "rb") as fi, gzip.GzipFile(out, "wb", mtime=0) as fo:
            shutil.copyfileobj(fi, fo)
    return out, note


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("exports", nargs="+", type=Path, help="one SQLite export per rank (nsys --export=sqlite)")
    p.add_argument("--out", type=Path, required=True, help="folder for the .sqlite.gz files (created)")
    p.add_argument("--notes", type=Path, default=None, help="JSON file the trim sentences are added to")
    p.add_argument("--lean", action="store_true",
                   help="keep only the Synchronize calls of the CUDA API table and drop CUPTI's synchronization records "
                        "(about 3x smaller; what the four-GPU check reads is kept)")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.exports if not f.is_file()]
    if missing:
        raise GpuprofError(f"no such export: {', '.join(missing)}.")
    args.out.mkdir(parents=True, exist_ok=True)
    notes = json.loads(args.notes.read_text()) if args.notes and args.notes.exists() else {}
    for src in args.exports:
        out, note = trim_one(src, args.out, lean_export=args.lean)
        notes[out.name] = note
        print(f"{out}: {src.stat().st_size / 1e6:.1f} MB -> {out.stat().st_size / 1e6:.2f} MB gzipped ({note})")
    if args.notes:
        args.notes.write_text(json.dumps(notes, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
