import sys
from pathlib import Path

import pytest

from conftest import write_exe
from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import CaptureExists, GpuprofError
from gpuprof.runner import ProfilerFailed, run_profiler
from gpuprof.tools import Tool

# A stand-in profiler: "-o PREFIX" makes it write PREFIX.fake-rep holding its arguments,
# and every run leaves a marker so tests can tell whether it ran at all.
FAKE = r'''
out=""
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift 2;; *) echo "arg:$1"; shift;; esac
done
echo ran >> "$MARKER"
[ -n "$out" ] && echo "report" > "$out.fake-rep"
exit 0
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    marker = tmp_path / "runs.txt"
    monkeypatch.setenv("MARKER", str(marker))
    path = write_exe(tmp_path / "bin" / "fakeprof", FAKE)
    return Tool("nsys", path, "test"), marker


def runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_capture_is_moved_into_place_with_a_log(fake, tmp_path):
    tool, marker = fake
    out = tmp_path / "out"
    cap = run_profiler(tool, ["profile", "-o", "{output}"], ["python", "x.py"], out_dir=out, name="smoke")
    assert [f.name for f in cap.files] == ["smoke.fake-rep"]
    assert (out / "smoke.fake-rep").read_text() == "report\n"
    assert cap.command[-4:] == ["-o", str(out / "smoke"), "python", "x.py"]
    assert "arg:python" in (out / "smoke.log").read_text()
    assert not list(out.glob(".*partial*")), "the temporary folder must be gone"


def test_existing_capture_is_refused_before_profiling(fake, tmp_path):
    tool, marker = fake
    out = tmp_path / "out"
    run_profiler(tool, ["-o", "{output}"], ["a"], out_dir=out, name="smoke")
    (out / "smoke.fake-rep").write_text("precious\n")
    with pytest.raises(CaptureExists, match="already holds a capture named 'smoke'"):
        run_profiler(tool, ["-o", "{output}"], ["a"], out_dir=out, name="smoke")
    assert runs(marker) == 1, "the profiler must not run when its output would be refused"
    assert (out / "smoke.fake-rep").read_text() == "precious\n"


def test_overwrite_when_asked(fake, tmp_path, monkeypatch):
    tool, _ = fake
    out = tmp_path / "out"
    run_profiler(tool, ["-o", "{output}"], ["a"], out_dir=out, name="smoke")
    (out / "smoke.fake-rep").write_text("old\n")
    run_profiler(tool, ["-o", "{output}"], ["a"], out_dir=out, name="smoke", overwrite=True)
    assert (out / "smoke.fake-rep").read_text() == "report\n"
    monkeypatch.setenv("GPUPROF_OVERWRITE", "1")
    run_profiler(tool, ["-o", "{output}"], ["a"], out_dir=out, name="smoke")


def test_failure_keeps_the_earlier_capture_and_explains(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "smoke.ncu-rep").write_text("earlier\n")
    bad = write_exe(tmp_path / "ncu", 'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"; exit 1')
    with pytest.raises(ProfilerFailed) as exc:
        run_profiler(Tool("ncu", bad, "test"), ["-o", "{output}"], ["a"], out_dir=out, name="smoke", overwrite=True)
    assert "restricted to administrators" in str(exc.value)
    assert (out / "smoke.ncu-rep").read_text() == "earlier\n"
    assert "ERR_NVGPUCTRPERM" in (out / "smoke.log").read_text()
    assert not list(out.glob(".*partial*"))


def test_timeout_is_reported_and_leaves_nothing(tmp_path):
    slow = write_exe(tmp_path / "slow", "sleep 5")
    with pytest.raises(ProfilerFailed, match="did not finish within 1 s"):
        run_profiler(Tool("nsys", slow, "test"), [], ["a"], out_dir=tmp_path / "out", name="smoke", timeout=1)
    assert not list((tmp_path / "out").glob(".*partial*"))


def test_arguments_are_passed_literally_never_through_a_shell(fake, tmp_path):
    tool, _ = fake
    out = tmp_path / "out"
    evil = f"a b; touch {tmp_path / 'pwned'}"
    cap = run_profiler(tool, [], ["python", evil], out_dir=out, name="lit")
    assert f"arg:{evil}" in cap.log.read_text()
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["", "../up", ".hidden", "a/b"])
def test_bad_capture_names(fake, tmp_path, name):
    with pytest.raises(GpuprofError, match="Invalid capture name"):
        run_profiler(fake[0], [], ["a"], out_dir=tmp_path, name=name)


def test_a_torchrun_child_gets_torchrun_s_own_thread_default_and_nothing_else_changes(monkeypatch):
    from gpuprof.runner import child_env, python_target, torchrun_target

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert child_env(torchrun_target("x.py", "--a"))["OMP_NUM_THREADS"] == "1"  # what torchrun would set, minus its banner
    assert child_env(["nsys", "profile", *torchrun_target("x.py")])["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in child_env(python_target("x.py"))
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert child_env(torchrun_target("x.py"))["OMP_NUM_THREADS"] == "8"  # a reader's own setting wins
    assert child_env(python_target("x.py"), {"A": "b"})["A"] == "b"


def test_machine_paths_are_cut_from_tool_messages():
    from gpuprof.runner import portable_text

    said = ("cuDNN symbols found in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9 "
            f"symbol table; see /tmp/nvidia/quadd_session_1/streams/pid_2_stdout.log; report {REPO_ROOT}/artifacts/ch01/x.sqlite")
    assert portable_text(said) == ("cuDNN symbols found in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib/"
                                   "libcudnn_graph.so.9 symbol table; see pid_2_stdout.log; report artifacts/ch01/x.sqlite")
    assert portable_text(said, every_path=True) == ("cuDNN symbols found in libcudnn_graph.so.9 symbol table; "
                                                    "see pid_2_stdout.log; report artifacts/ch01/x.sqlite")
    assert portable_text("1/2 of a/b/c", every_path=True) == "1/2 of a/b/c"


def test_a_scripts_echoed_output_names_no_scratch_folder(capsys, tmp_path):
    """Chapters echo a script's output as it runs (gpuprof.runner.run_streaming); its 'results written to' line
    names a scratch file under the temporary folder, which the echo cuts to the file's name (the lines kept for
    parsing stay as the script printed them)."""
    import tempfile

    from gpuprof.runner import run_streaming

    scratch = Path(tempfile.mkdtemp()) / "train_run.json"
    code, lines = run_streaming([sys.executable, "-c", f"print('results written to {scratch}')"], 60, name="echo")
    shown = capsys.readouterr().out
    assert code == 0 and lines == [f"results written to {scratch}"]
    assert shown.strip() == "results written to train_run.json"


def test_a_shown_command_pastes_into_a_shell_as_the_same_words():
    """Review item 1: a ``$`` line with ``regex:a|b`` unquoted runs a pipe when pasted."""
    import shlex
    import sys

    from gpuprof.runner import portable_command, shell_line

    cmd = ["/opt/ncu", "--kernel-name", "regex:saxpy|elementwise", "-o", "out dir/x", sys.executable, "-c", "print(1)",
           "name_rank%q{RANK}", "--plain", "a.py"]
    line = shell_line(cmd)
    assert "'regex:saxpy|elementwise'" in line and line.startswith("ncu --kernel-name ")
    assert "--plain a.py" in line, "words the shell leaves alone stay unquoted"
    assert shlex.split(line) == portable_command(cmd)
    env_line = shell_line(["python", "x.py"], {"NCCL_MAX_NCHANNELS": "4", "A": "x y"})
    assert env_line == "NCCL_MAX_NCHANNELS=4 A='x y' python x.py"
