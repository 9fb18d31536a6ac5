import pytest

from conftest import write_exe
from gpuprof import tools
from gpuprof.errors import GpuprofError, ToolNotFound
from gpuprof.tools import check_counter_access, classify_ncu_output, find_tool, profiling_restricted, tool_version

NSYS_VERSION = 'echo "NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0"'
NCU_VERSION = 'echo "NVIDIA (R) Nsight Compute Command Line Profiler"; echo "Version 2025.3.1.0 (build 36398880) (public-release)"'


def test_found_on_path_with_its_version(clean_tool_env):
    write_exe(clean_tool_env / "nsys", NSYS_VERSION)
    tool = find_tool("nsys", install_globs=[])
    assert tool.found_via == "PATH" and tool.path == clean_tool_env / "nsys"
    assert tool_version(tool) == "2025.3.1.90"


def test_environment_variable_wins_over_path(clean_tool_env, tmp_path, monkeypatch):
    write_exe(clean_tool_env / "ncu", NCU_VERSION)
    mine = write_exe(tmp_path / "elsewhere" / "ncu", NCU_VERSION)
    monkeypatch.setenv("NCU", str(mine))
    tool = find_tool("ncu")
    assert tool.path == mine and tool.found_via == "NCU variable"
    assert tool_version(tool) == "2025.3.1.0"


def test_variable_pointing_nowhere_is_reported_not_ignored(clean_tool_env, monkeypatch):
    write_exe(clean_tool_env / "nsys", NSYS_VERSION)
    monkeypatch.setenv("NSYS", "/no/such/nsys")
    with pytest.raises(ToolNotFound, match="NSYS is set to '/no/such/nsys', which is not an executable file"):
        find_tool("nsys")


def test_install_folders_prefer_the_newest_version(clean_tool_env, tmp_path):
    for version in ("2024.1.1", "2025.3.1", "2023.4.4"):
        write_exe(tmp_path / "opt" / version / "bin" / "nsys", NSYS_VERSION)
    tool = find_tool("nsys", install_globs=[str(tmp_path / "opt" / "*" / "bin" / "nsys")])
    assert tool.found_via == "install folder" and "2025.3.1" in str(tool.path)


def test_missing_tool_says_how_to_install(clean_tool_env):
    with pytest.raises(ToolNotFound) as exc:
        find_tool("ncu", install_globs=[])
    assert "ncu was not found" in str(exc.value) and "Install Nsight Compute" in str(exc.value)


def test_unknown_tool_name():
    with pytest.raises(GpuprofError, match="Unknown tool"):
        find_tool("nvprof")


def test_version_output_without_a_number(clean_tool_env):
    write_exe(clean_tool_env / "nsys", 'echo "something else"')
    with pytest.raises(GpuprofError, match="printed no version number"):
        tool_version(find_tool("nsys", install_globs=[]))


REAL_DENIED = ("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
               "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
               "Counters on the target device 0. For instructions on enabling permissions and to get more "
               "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n")


def test_classify_counter_permission_denied():
    result = classify_ncu_output(REAL_DENIED, 1)
    assert result.status == "denied" and not result.ok
    assert "NVreg_RestrictProfilingToAdminUsers=0" in result.detail


def test_classify_counters_readable():
    text = "==PROF== Connected to process 1\n==PROF== Profiling \"saxpy\" - 0: 0%....50%....100% - 1 pass\n==PROF== Disconnected from process 1\n"
    assert classify_ncu_output(text, 0).ok


def test_classify_no_kernel_profiled():
    assert classify_ncu_output("==WARNING== No kernels were profiled.\n", 0).status == "unknown"


def test_check_counter_access_with_a_fake_ncu_that_is_denied(clean_tool_env):
    body = "cat <<'MSG'\n" + REAL_DENIED + "MSG\nexit 1"
    write_exe(clean_tool_env / "ncu", body)
    result = check_counter_access(find_tool("ncu", install_globs=[]), ["python", "x.py"], "saxpy")
    assert result.status == "denied"


@pytest.mark.parametrize("text,euid,expected", [
    ("RmProfilingAdminOnly: 1\n", 1000, True),
    ("RmProfilingAdminOnly: 1\n", 0, False),
    ("RmProfilingAdminOnly: 0\n", 1000, False),
    ("SomethingElse: 3\n", 1000, None),
])
def test_driver_profiling_restriction(tmp_path, monkeypatch, text, euid, expected):
    params = tmp_path / "params"
    params.write_text(text)
    monkeypatch.setattr(tools.os, "geteuid", lambda: euid)
    assert profiling_restricted(params) is expected


def test_no_driver_means_unknown(tmp_path):
    assert profiling_restricted(tmp_path / "absent") is None
