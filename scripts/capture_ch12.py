#!/usr/bin/env python3
"""Regenerate chapter 12's references on one GPU, then execute its notebook: one command for the course's GPU run.

Chapter 12 (``notebooks/12__llm_inference.ipynb``) reads its references only: the decode runs take minutes
and load 16 GB of weights per process, more than a notebook cell should hide. This script makes them, in
``artifacts/ch12/`` with their provenance (``gpuprof.artifacts.record_file``), each from a command the
provenance records as run:

1. ``ceilings.json``: the device copy and the BF16 product (chapter 0's measurements), in this session;
2. ``ladder.json``: every rung at batch 1, 8 and 64 (prompt 512, 64 steps), with the logit check;
3. ``sweep.json``: the ``graph`` rung at batch 1 to 1,024 (prompt 32, 32 steps), with the check;
4. ``decode_b1.sqlite.gz``: Nsight Systems over ``eager_dynamic`` and ``compile_graph`` at batch 1 (the
   naive loop and the best rung; ``--cuda-graph-trace=node``), exported and gzipped;
5. ``prefill2048.json``: prefill of 2,048 tokens at batch 1 and 8;
6. ``noclone.json``: the ``--no-clone`` pitfall (its check must fail: exit status 2 is the expected one);
7. ``kv_capacity.json``: ``examples/nsys/kv_capacity.py`` (step ``kv``), the largest batch whose KV cache and one
   decoding step fit beside the weights at contexts of 1,024 to 131,072 tokens, found by real allocations, beside
   the arithmetic's prediction for the same free memory. Its time is unmeasured (no GPU has run it yet); estimated
   at under a minute beyond loading the weights: some 40 tries, each writing its cache once and reading it and the
   weights once, at most the GPU's memory each way;

then ``scripts/capture_all.py --notebooks notebooks/12__llm_inference.ipynb`` (executes the notebook in
place and runs strict nbval over it). Each run's printed output goes to ``artifacts/ch12/run_output.txt``.

A run whose check fails (exit 2) is kept (its JSON is written before the exit) and reported at the end;
the script exits 2 then, after everything else has run. ``--only`` runs some steps (e.g. ``--only nsys,notebook``).
About 8 minutes on an H100, estimated (the first run of the same commands: ladder 124 s, sweep 188 s with one
more batch; the rest unmeasured). To stay inside a 10-minute command, split it: ``--only ceilings,ladder,sweep``
then ``--only nsys,prefill,noclone,kv,notebook`` (the second part adds to the first's log; ``kv`` unmeasured).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuprof import describe_machine, exit_on_error  # noqa: E402
from gpuprof.errors import GpuprofError  # noqa: E402

SCRIPT = "examples/nsys/llm_decode.py"
DECODE = ["--model", "8b"]
RUNS = {  # name: (arguments, the exit status expected)
    "ladder.json": ([*DECODE, "--batch", "1,8,64", "--prompt-len", "512", "--new-tokens", "64"], 0),
    "sweep.json": ([*DECODE, "--rung", "graph", "--batch", "1,2,4,8,16,32,64,128,256,384,512,1024",
                    "--prompt-len", "32", "--new-tokens", "32"], 0),
    "prefill2048.json": ([*DECODE, "--rung", "eager_static", "--batch", "1,8", "--prompt-len", "2048",
                          "--new-tokens", "2", "--no-check"], 0),
    "noclone.json": ([*DECODE, "--rung", "graph", "--batch", "1", "--prompt-len", "512", "--new-tokens", "16",
                      "--no-clone"], 2),
}
NSYS_ARGS = [*DECODE, "--rung", "eager_dynamic,compile_graph", "--batch", "1", "--prompt-len", "512",
             "--new-tokens", "32", "--no-check"]
KV_SCRIPT = "examples/nsys/kv_capacity.py"
KV_ARGS = ["--model", "8b", "--context", "1024,4096,32768,131072"]
STEPS = ("ceilings", "ladder", "sweep", "nsys", "prefill", "noclone", "kv", "notebook")
NOTEBOOK = "notebooks/12__llm_inference.ipynb"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(STEPS),
                   help=f"the steps to run, separated by commas (default: all, in this order: {', '.join(STEPS)})")
    args = p.parse_args(argv)
    steps = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        p.error(f"unknown step(s) {', '.join(unknown) or repr(args.only)}; the steps are {', '.join(STEPS)}")
    args.steps = steps
    return args


def run_decode(name: str, args: list[str], expected: int, log, script: str = SCRIPT) -> int:  # type: ignore[no-untyped-def]
    """``script`` (the decoder's, unless another is named) with ``args --json artifacts/ch12/<name>``, its output to
    the terminal and the log; the JSON recorded with the command as shown. Returns the exit status."""
    from gpuprof.artifacts import chapter_output, record_file

    out = chapter_output("ch12") / name
    shown = " ".join(["python3", script, *args, "--json", name])
    print(f"$ {shown}", flush=True)
    log.write(f"$ {shown}\n")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / script), *args, "--json", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
    code = proc.wait()
    note = f"exit {code} ({'expected' if code == expected else f'expected {expected}'}), {time.perf_counter() - t0:.0f} s"
    print(f"== {name}: {note}", flush=True)
    log.write(f"== {name}: {note}\n")
    if out.exists():
        record_file("ch12", name, shown + (f" (exit {code}, as expected: its check fails)" if expected else ""))
    return code


def ceilings() -> None:
    """The device copy and the BF16 product, measured now: the shares of the chapter are of these."""
    from gpuprof.artifacts import save_json
    from gpuprof.backend import choose_backend
    from gpuprof.studies import speed_of_light as s

    copy, matmul = s.device_copy(choose_backend()), s.matmul_bf16()
    if matmul is None:
        raise GpuprofError("No BF16 product could be measured here (it needs PyTorch on a GPU).")
    data = {"gpu": describe_machine().gpu_name, "d2d_gbps": copy.value, "d2d_how": copy.how,
            "matmul_bf16_tflops": matmul.value, "matmul_how": matmul.how}
    print(f"ceilings: device copy {copy.value:,.1f} GB/s, BF16 product {matmul.value:,.1f} TFLOP/s", flush=True)
    save_json("ch12", "ceilings.json", data, overwrite=True,
              command="python3 scripts/capture_ch12.py --only ceilings (gpuprof.studies.speed_of_light.device_copy "
                      "and matmul_bf16)")


def nsys_capture() -> None:
    """nsys over the naive loop and the best rung at batch 1; the export gzipped as the course commits it."""
    from gpuprof.artifacts import chapter_output, gzip_reference
    from gpuprof.studies import llm_inference as li

    cap = li.capture_decode("decode_b1", NSYS_ARGS)
    if cap.sqlite.source != "this machine":
        raise GpuprofError("The nsys capture was not made here (its message is above).")
    folder = chapter_output("ch12")
    gzip_reference(folder / "decode_b1.sqlite")
    (folder / "decode_b1.nsys-rep").unlink(missing_ok=True)  # raw reports stay out of the course (.gitignore)
    print(li.capture_summary(folder / "decode_b1.sqlite.gz").round(3).to_string(), flush=True)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = describe_machine()
    if machine.device != "cuda":
        raise GpuprofError(f"capture_ch12.py needs a GPU: this machine is {machine.summary()}.",
                           "References from a CPU would be worthless; the notebook reads the committed ones here.")
    os.environ.update({"GPUPROF_OUTPUT_DIR": "artifacts", "GPUPROF_OVERWRITE": "1", "GPUPROF_STRICT": "1"})
    from gpuprof.artifacts import chapter_output, record_file

    print(f"capture_ch12: {machine.summary()}; steps {', '.join(args.steps)}", flush=True)
    failed: list[str] = []
    log_path = chapter_output("ch12") / "run_output.txt"
    # a run that starts with the ceilings starts the log afresh; a later part (--only nsys,...) adds to it
    with open(log_path, "w" if args.steps[0] == "ceilings" else "a") as log:
        log.write(f"== capture_ch12 {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, steps "
                  f"{', '.join(args.steps)}, on {machine.summary()}\n")
        for step in args.steps:
            t0 = time.perf_counter()
            if step == "ceilings":
                ceilings()
            elif step == "nsys":
                nsys_capture()
            elif step == "notebook":
                continue  # after the log is closed and recorded
            elif step == "kv":
                if run_decode("kv_capacity.json", KV_ARGS, 0, log, KV_SCRIPT) != 0:
                    failed.append("kv_capacity.json")
            else:
                name = {"ladder": "ladder.json", "sweep": "sweep.json", "prefill": "prefill2048.json",
                        "noclone": "noclone.json"}[step]
                run_args, expected = RUNS[name]
                if run_decode(name, run_args, expected, log) != expected:
                    failed.append(name)
            print(f"== step {step}: {time.perf_counter() - t0:.0f} s", flush=True)
    record_file("ch12", "run_output.txt", "python3 scripts/capture_ch12.py --only " + ",".join(args.steps)
                + " (the decode runs' printed output)")
    if "notebook" in args.steps:
        code = subprocess.call([sys.executable, str(ROOT / "scripts" / "capture_all.py"), "--notebooks", NOTEBOOK],
                               cwd=ROOT)
        if code != 0:
            failed.append(f"{NOTEBOOK} (capture_all exit {code})")
    if failed:
        raise GpuprofError(f"finished, but not as expected: {', '.join(failed)}.",
                           "Read their output above (and in artifacts/ch12/run_output.txt); the JSON is kept.")
    print("capture_ch12: done; commit artifacts/ch12 and the notebook after reading the checks above", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
