"""run_for_json: a script's JSON results filed with provenance on a GPU, the reference without one."""

from types import SimpleNamespace

import pytest

from gpuprof import script_results
from gpuprof.artifacts import REPO_ROOT
from gpuprof.errors import GpuprofError


def test_without_a_gpu_the_reference_is_used(capsys):
    found = script_results.run_for_json("ch03", "timings.json", REPO_ROOT / "examples" / "nsys" / "weight_streaming.py")
    assert found.source == "reference" and found.path == REPO_ROOT / "artifacts" / "ch03" / "timings.json"
    assert "No GPU on this machine" in capsys.readouterr().out


@pytest.fixture
def pretend_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPROF_OUTPUT_DIR", str(tmp_path / "out"))
    fake = SimpleNamespace(device="cuda", summary=lambda: "a GPU")
    monkeypatch.setattr(script_results, "describe_machine", lambda: fake)
    return tmp_path


def test_on_a_gpu_the_script_runs_and_its_json_is_recorded(pretend_gpu, capsys):
    script = pretend_gpu / "writer.py"
    script.write_text("import json, sys\nprint('step 1 of 1')\njson.dump({'x': 1}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))\n")
    found = script_results.run_for_json("chX", "r.json", script, ["--flag"])
    assert found.json() == {"x": 1} and found.source == "this machine"
    assert "--flag --json r.json" in found.provenance["command"]
    out = capsys.readouterr().out
    assert "step 1 of 1" in out and out.startswith("$ ")


def test_the_transcript_names_the_results_file_not_its_temporary_path(pretend_gpu, capsys):
    script = pretend_gpu / "teller.py"
    script.write_text("import json, sys\npath = sys.argv[sys.argv.index('--json') + 1]\n"
                      "json.dump({'x': 1}, open(path, 'w'))\nprint(f'results written to {path}')\n")
    script_results.run_for_json("chX", "told.json", script)
    out = capsys.readouterr().out
    assert "  results written to told.json\n" in out and "tmp" not in out.split("$ ", 1)[1].split("\n", 1)[1]


def test_a_failing_script_is_one_sentence(pretend_gpu):
    script = pretend_gpu / "broken.py"
    script.write_text("print('about to fail')\nraise SystemExit(3)\n")
    with pytest.raises(GpuprofError, match=r"broken.py failed \(exit 3\): about to fail"):
        script_results.run_for_json("chX", "r.json", script, echo=False)
    assert not (pretend_gpu / "out" / "chX" / "r.json").exists()


def test_variables_given_reach_the_script_and_head_its_recorded_command(pretend_gpu, capsys):
    script = pretend_gpu / "env_writer.py"
    script.write_text("import json, os, sys\njson.dump({'cap': os.environ.get('NCCL_MAX_NCHANNELS')}, "
                      "open(sys.argv[sys.argv.index('--json') + 1], 'w'))\n")
    found = script_results.run_for_json("chX", "e.json", script, env={"NCCL_MAX_NCHANNELS": "4"})
    assert found.json() == {"cap": "4"}
    assert found.provenance["command"].startswith("NCCL_MAX_NCHANNELS=4 ")
    assert capsys.readouterr().out.startswith("$ NCCL_MAX_NCHANNELS=4 ")
