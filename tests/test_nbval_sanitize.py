"""The strict-nbval sanitizers: what they mask is what legitimately differs between lent GPU machines."""

import re

from nbval import plugin

from gpuprof.artifacts import REPO_ROOT


def sanitize(text: str) -> str:
    """Apply tests/nbval_sanitize.cfg's rules in order, parsed by nbval's own reader, as strict nbval does."""
    rules = plugin.get_sanitize_patterns((REPO_ROOT / "tests" / "nbval_sanitize.cfg").read_text())
    assert len(rules) > 5  # the file parsed
    for regex, replace in rules:
        text = re.sub(regex, replace, text)
    return text


def test_one_and_two_gpu_machines_print_the_same_compared_summary():
    one = "NVIDIA H200 | driver 580.159.04 | CUDA runtime 13.0 | 139.8 GiB | 132 SMs | sm_90; torch 2.11.0+cu130"
    two = "2 x NVIDIA H100 80GB HBM3 | driver 580.159.04 | CUDA runtime 13.0 | 79.2 GiB | 132 SMs | sm_90; torch 2.11.0+cu130"
    assert sanitize(one) == sanitize(two)


def test_counts_of_other_things_stay_compared():
    assert sanitize("DDP's default layout: 1.024 x the step") == "DDP's default layout: N x the step"
    assert sanitize("42 passed") == sanitize("41 passed")  # numbers are masked; words are not
    assert sanitize("fp32 1.02 x faster") != sanitize("fp32 1.02 x slower")
