import time

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.timing import Timing, format_seconds, time_call


def test_warmup_and_repeats_call_counts():
    calls = []
    t = time_call(lambda: calls.append(1), warmup=2, repeats=5, inner=3)
    assert len(calls) == 2 + 5 * 3
    assert len(t.samples) == 5 and t.method == "perf_counter" and t.warmup == 2


def test_timer_measures_the_work_not_less():
    # a lower bound only: sleep never returns early, but how late it returns depends on how busy the machine is
    t = time_call(lambda: time.sleep(0.002), warmup=0, repeats=3)
    assert len(t.samples) == 3 and all(s >= 0.002 for s in t.samples) and t.median >= 0.002


def test_a_cpu_sample_is_the_clocks_advance_over_the_inner_calls(monkeypatch):
    """On a clock that only the timed call moves (2 ms a call), each sample is exactly 2 ms: not less, not more, and
    not the warm-up's time, whatever the machine's speed."""
    import gpuprof.timing as timing
    from gpuprof.backend import choose_backend

    now = [100.0]

    def work() -> None:
        now[0] += 0.002

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    t = time_call(work, backend=choose_backend("cpu"), warmup=4, repeats=3, inner=5)
    assert t.method == "perf_counter" and t.samples == pytest.approx((0.002,) * 3)


def test_statistics_on_known_samples():
    t = Timing((1.0, 2.0, 3.0, 4.0, 100.0), "perf_counter", 0)
    assert t.median == 3.0 and t.minimum == 1.0 and t.maximum == 100.0
    lo, hi = t.iqr
    assert (lo, hi) == (2.0, 4.0)
    assert t.relative_spread == pytest.approx(2 / 3)
    assert "median 3.00 s" in str(t)


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}, {"inner": 0}])
def test_bad_arguments_are_reported(kwargs):
    with pytest.raises(GpuprofError, match="time_call needs"):
        time_call(lambda: None, **kwargs)


@pytest.mark.parametrize("seconds,text", [(8.5e-7, "850 ns"), (1.23e-5, "12.3 us"), (4.56e-3, "4.56 ms"), (1.234, "1.23 s")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text
