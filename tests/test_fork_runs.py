"""The fork server: every run a process of its own, with its own environment and log; failures and time-outs reported."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuprof.artifacts import REPO_ROOT


SCRIPT = '''
import json, os, sys, time

def main(argv):
    what, out = argv
    if what == "hang":
        time.sleep(600)
    if what == "fail":
        print("this run breaks", file=sys.stderr)
        return 3
    with open(out, "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "env": os.environ.get("RUN_TAG"), "torch": "torch" in sys.modules}, f)
    print("ran", what)
    return 0
'''


def test_runs_are_separate_processes_with_their_own_environment_and_log(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(SCRIPT)
    runs = [{"argv": ["ok", str(tmp_path / "a.json")], "env": {"RUN_TAG": "a"}, "log": str(tmp_path / "a.log")},
            {"argv": ["fail", "-"], "env": {}, "log": str(tmp_path / "b.log")},
            {"argv": ["hang", "-"], "env": {}, "log": str(tmp_path / "c.log")},
            {"argv": ["ok", str(tmp_path / "d.json")], "env": {"RUN_TAG": "d"}, "log": str(tmp_path / "d.log")}]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"script": str(script), "preload": None, "timeout_s": 3, "runs": runs}))
    proc = subprocess.run([sys.executable, "-m", "gpuprof.fork_runs", str(plan)], capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("RUN ")]
    assert [(l[1], l[2]) for l in lines] == [("0", "0"), ("1", "3"), ("2", "timeout"), ("3", "0")]
    a, d = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "d.json"))
    assert a["pid"] != d["pid"] and a["ppid"] == d["ppid"]  # two children of one server
    assert (a["env"], d["env"]) == ("a", "d") and a["torch"]  # each its own environment; PyTorch imported once, above
    assert "ran ok" in (tmp_path / "a.log").read_text() and "this run breaks" in (tmp_path / "b.log").read_text()


def test_a_bad_plan_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "gpuprof.fork_runs", "/no/such/plan.json"], capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 2 and "usage: python -m gpuprof.fork_runs PLAN.json" in proc.stderr


def test_run_all_yields_each_run_with_its_status_and_output_in_order(tmp_path):
    from gpuprof.fork_runs import run_all

    script = tmp_path / "fake.py"
    script.write_text(SCRIPT)
    argvs = [["ok", str(tmp_path / "a.json")], ["fail", "-"], ["ok", str(tmp_path / "c.json")]]
    got = list(run_all(script, argvs, envs=[{"RUN_TAG": "a"}, {}, {"RUN_TAG": "c"}], timeout_s=60))
    assert [(i, status) for i, status, _, _ in got] == [(0, "0"), (1, "3"), (2, "0")]
    assert "ran ok" in got[0][3] and "this run breaks" in got[1][3]
    assert json.loads((tmp_path / "c.json").read_text())["env"] == "c"


def test_run_all_says_why_when_the_server_cannot_start(tmp_path):
    import pytest

    from gpuprof.errors import GpuprofError
    from gpuprof.fork_runs import run_all

    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('cannot import this script')\n")
    with pytest.raises(GpuprofError, match="stopped early"):
        list(run_all(script, [["x"]], timeout_s=30))
