"""gpuprof.checks: the sentence a verdict cell prints, and the test it makes, come from the same bound."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gpuprof.checks import at_least, at_most, between, check, equals, number, over, under, within


def test_the_reviews_example(capsys):
    check("data on the GPU: {} the rung before", 3.27, at_least(1.5), fmt=".1f", unit="x")
    assert capsys.readouterr().out == "data on the GPU: 3.3x the rung before (checked: at least 1.5x)\n"


@pytest.mark.parametrize("x, fmt, unit, text", [
    (1.5, ".1f", "x", "1.5x"),
    (2, ".1f", "x", "2x"),  # no trailing zeros
    (0.4, ".0%", "", "40%"),
    (0.9, ".1%", "", "90%"),
    (0.375, ".0%", "", "37.5%"),  # as many decimals as it takes to be exact...
    (1.05, ".1f", "", "1.05"),
    (1 / 3, ".0%", "", "33%"),  # ...else as many as the value's format
    (1 / 3, ".2f", "", "0.33"),
    (20, ".1f", " ms", "20 ms"),
    (2500, ",.0f", "", "2,500"),
    (0.005, ".2%", "", "0.5%"),
    (4, "", "", "4"),
    (0.25, "", "", "0.25"),
])
def test_a_bounds_number_in_the_values_format(x, fmt, unit, text):
    assert number(x, fmt, unit) == text


@pytest.mark.parametrize("bound, words", [
    (at_least(1.5), "at least 1.5x"), (over(1.5), "over 1.5x"), (under(1.5), "under 1.5x"),
    (at_most(1.5), "at most 1.5x"), (between(0.85, 1.15), "between 0.85x and 1.15x"), (equals(2), "exactly 2x"),
    (within(1, 0.05), "within 5% of 1x"),
])
def test_each_bound_describes_itself(bound, words):
    assert bound.describe(".2f", "x") == words


def test_a_share_is_described_as_a_percentage():
    assert over(0.4).describe(".0%") == "over 40%"
    assert between(0.3, 0.6).describe(".0%") == "between 30% and 60%"
    assert within(20, 0.25).describe(".1f", " ms") == "within 25% of 20 ms"


@pytest.mark.parametrize("bound, passing, failing", [
    (at_least(1.5), [1.5, 1.5000001, 100], [1.4999999, 0, -1]),
    (over(1.5), [1.5000001, 100], [1.5, 1.4999999]),
    (at_most(0.5), [0.5, 0.4999999, -3], [0.5000001]),
    (under(0.5), [0.4999999, -3], [0.5, 0.5000001]),
    (between(0.9, 1.1), [0.9, 1.0, 1.1], [0.8999999, 1.1000001]),
    (equals(2), [2, 2.0], [1.9999999, 2.0000001]),
    (within(1, 0.05), [1.0, 1.0499999, 0.9500001], [1.05, 0.95, 1.0500001]),  # the edge itself is out
    (within(20, 0.25), [15.0001, 24.9999], [15, 25]),
])
def test_each_bound_at_and_around_its_edges(bound, passing, failing):
    assert all(bound.test(v) for v in passing)
    assert not any(bound.test(v) for v in failing)


@pytest.mark.parametrize("bound", [at_least(0), over(0), under(1), at_most(1), between(0, 1), equals(0), within(1, 0.5)])
def test_nan_meets_no_bound(bound, capsys):
    assert not bound.test(float("nan"))
    with pytest.raises(AssertionError, match="nan"):
        check("the share: {}", float("nan"), bound, fmt=".2f")


def test_a_failing_check_prints_and_raises_with_the_sentence(capsys):
    with pytest.raises(AssertionError) as failed:
        check("batch 256: {} the images/s of batch 32", 1.9, at_least(2), fmt=".1f", unit="x")
    sentence = "batch 256: 1.9x the images/s of batch 32 (checked: at least 2x)"
    assert sentence in str(failed.value)
    assert capsys.readouterr().out == sentence + "\n"


def test_a_check_survives_python_O():
    """It raises by itself, so running without assertions does not remove the test."""
    import subprocess
    import sys

    code = "from gpuprof.checks import check, over\ncheck('x {}', 0.1, over(0.5))"
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert run.returncode != 0 and "AssertionError: failed: x 0.1 (checked: over 0.5)" in run.stderr


def test_numpy_and_pandas_scalars(capsys):
    check("{} of the step", np.float32(0.5), over(0.4), fmt=".0%")
    check("{} calls", np.int64(2), equals(2))
    check("{} ms", pd.Series([3.0]).iloc[0], under(20), fmt=".1f")
    assert capsys.readouterr().out.splitlines() == [
        "50% of the step (checked: over 40%)", "2 calls (checked: exactly 2)", "3.0 ms (checked: under 20)"]


def test_check_returns_nothing(capsys):
    """A check on a cell's last line must not add an Out[] to the notebook."""
    assert check("{}", 1, equals(1)) is None


@pytest.mark.parametrize("bound, worst", [
    (under(0.25), 0.2), (at_most(0.25), 0.2), (at_least(0.0), 0.0), (over(-1), 0.0),
    (between(0.05, 0.2), 0.0), (within(0.15, 0.5), 0.0), (equals(0.19), 0.0),
])
def test_of_several_values_the_worst_is_the_one_nearest_to_failing(bound, worst):
    assert bound.worst([0.1, 0.0, 0.2]) == worst
    assert math.isnan(bound.worst([0.1, float("nan")]))


def test_several_values_show_the_worst(capsys):
    check("every rank: at most {} of the time hidden", pd.Series([0.0, 0.1, 0.2], index=[0, 1, 2]), under(0.25), fmt=".0%")
    check("steps within {} of the default's", np.array([0.99, 1.02]), between(0.85, 1.15), fmt=".2f")
    assert capsys.readouterr().out.splitlines() == [
        "every rank: at most 20% of the time hidden (checked: under 25%)",
        "steps within 1.02 of the default's (checked: between 0.85 and 1.15)"]


def test_several_values_fail_when_any_fails(capsys):
    for values in (pd.Series([0.1, 0.3]), np.array([0.1, 0.3]), [0.1, 0.3], (0.1, float("nan"))):
        with pytest.raises(AssertionError, match="under 25%"):
            check("hidden on every rank: at most {}", values, under(0.25), fmt=".0%")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "hidden on every rank: at most 30% (checked: under 25%)"
    assert out[-1] == "hidden on every rank: at most nan% (checked: under 25%)"  # NaN is the worst value


def test_bad_claims_and_empty_values():
    with pytest.raises(ValueError, match="exactly one"):
        check("no place for the value", 1, equals(1))
    with pytest.raises(ValueError, match="exactly one"):
        check("{} and {}", 1, equals(1))
    with pytest.raises(ValueError, match="no values"):
        check("{}", pd.Series([], dtype=float), under(1))


def test_literal_braces_elsewhere_in_a_claim(capsys):
    check("dict {'a': 1} gives {}", 1, equals(1))
    assert capsys.readouterr().out == "dict {'a': 1} gives 1 (checked: exactly 1)\n"


def test_every_verdict_is_logged_where_asked(tmp_path, monkeypatch, capsys):
    """Strict nbval masks a compared output's numbers, so check() also appends each sentence, values and all,
    to the file GPUPROF_CHECK_LOG names (scripts/gpu_nbval.py sets one per notebook); unset, it writes nothing."""
    from gpuprof.checks import CHECK_LOG_ENV, at_least, check

    check("unlogged {}", 1.0, at_least(0), fmt=".1f")
    log = tmp_path / "x.checks.txt"
    monkeypatch.setenv(CHECK_LOG_ENV, str(log))
    check("hidden {}", 0.74, at_least(0.6), fmt=".0%")
    with pytest.raises(AssertionError):
        check("hidden {}", 0.74, at_least(0.75), fmt=".0%")
    check("shares {}", [0.92, 0.95], at_least(0.5), fmt=".2f")
    assert log.read_text().splitlines() == ["ok\thidden 74% (checked: at least 60%)",
                                            "FAILED\thidden 74% (checked: at least 75%)",
                                            "ok\tshares 0.92 (checked: at least 0.5)\tvalues: 0.92, 0.95"]
    # a log that cannot be written warns; the check still passes or fails on its value alone
    monkeypatch.setenv(CHECK_LOG_ENV, str(tmp_path / "missing" / "x.txt"))
    with pytest.warns(UserWarning, match="could not log"):
        check("hidden {}", 0.74, at_least(0.6), fmt=".0%")


def test_record_prints_and_logs_notes_beside_the_verdicts(tmp_path, monkeypatch, capsys):
    """record() keeps what explains a verdict (a cell not compared prints it, strict nbval keeps nothing of it):
    printed as given, and each line appended to the same log as a note, after the verdicts before it."""
    from gpuprof.checks import CHECK_LOG_ENV, at_least, check, record

    record("not logged")
    log = tmp_path / "x.checks.txt"
    monkeypatch.setenv(CHECK_LOG_ENV, str(log))
    check("hidden {}", 0.74, at_least(0.6), fmt=".0%")
    record("steady: steps 1, 2\nnot steady: steps 0, 3")
    assert capsys.readouterr().out.endswith("steady: steps 1, 2\nnot steady: steps 0, 3\n")
    assert log.read_text().splitlines() == ["ok\thidden 74% (checked: at least 60%)",
                                            "note\tsteady: steps 1, 2", "note\tnot steady: steps 0, 3"]


def test_record_warns_once_naming_itself_when_the_log_cannot_be_written(tmp_path, monkeypatch, capsys):
    from gpuprof.checks import CHECK_LOG_ENV, record

    monkeypatch.setenv(CHECK_LOG_ENV, str(tmp_path / "missing" / "x.txt"))
    with pytest.warns(UserWarning, match=r"^record\(\) could not log") as caught:
        record("two\nlines")
    assert len(caught) == 1 and capsys.readouterr().out == "two\nlines\n"
