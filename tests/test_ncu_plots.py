"""The Nsight Compute figures: drawn from the course's real reports, legible where data crowd together."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from gpuprof.artifacts import REPO_ROOT  # noqa: E402
from gpuprof.ncu import plots, report as nr  # noqa: E402

OCC_REP = REPO_ROOT / "artifacts" / "ch04" / "occupancy.ncu-rep"


def test_every_resource_at_the_minimum_is_marked_as_a_limiter():
    table = nr.metric_table(OCC_REP, list(plots.OCCUPANCY_LIMITS.values()))
    fig, ax = plt.subplots()
    plots.occupancy_limits(table, [str(i) for i in range(len(table))], ax=ax)
    values = table[list(plots.OCCUPANCY_LIMITS.values())].to_numpy(dtype=float)
    hatched = sum(bool(p.get_hatch()) for p in ax.patches)
    assert hatched == int((values == values.min(axis=1, keepdims=True)).sum()) > len(table)  # ties exist in this report
    assert [t.get_text() for t in ax.get_yticklabels()][:3] == ["1", "2", "4"]  # plain numbers on the log axis
    plt.close(fig)


def test_roofline_names_points_and_ceilings_in_a_legend():
    points = pd.DataFrame({"label": ["a", "b"], "intensity": [60.0, 61.0], "tflops": [30.0, 31.0]})
    fig, ax = plt.subplots()
    plots.roofline(points, bandwidth_gbps=3000, ceilings={"FP32": 50.0}, ax=ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["memory: 3,000 GB/s", "FP32: 50 TFLOP/s (ridge 17 FLOP/B)", "a: 30.0 TFLOP/s", "b: 31.0 TFLOP/s"]
    assert not ax.texts  # nothing written next to the marks, where close points would collide
    plt.close(fig)


def test_occupancy_bandwidth_keeps_the_reference_line_in_view():
    fig, ax = plt.subplots()
    plots.occupancy_bandwidth([32, 512, 1024], [9.0, 100.0, 100.0], [2200.0, 2900.0, 2950.0], reference_gbps=2980.0, ax=ax)
    assert ax.get_ylim()[1] > 2980.0
    assert [round(x) for x in ax.get_xticks()] == [32, 512, 1024]  # distinct x for equal occupancy
    plt.close(fig)
