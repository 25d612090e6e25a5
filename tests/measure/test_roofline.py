"""The roofline of synthetic:air12 on an H200 (HBM read bandwidth over the bytes a step reads)."""

import pytest

from patchbay.measure import roofline
from patchbay.runtime import synth


def test_air12_roofline_matches_the_design_figure_at_c1():
    config = synth.air12_config()
    assert roofline.step_params(config, 1) == pytest.approx(3.78e9, rel=0.002)  # the active parameters
    assert roofline.tokens_per_s(config, 1) == pytest.approx(550, abs=1)
    rates = [roofline.tokens_per_s(config, c) for c in (1, 4, 8, 32, 128)]
    assert rates == sorted(rates)  # more streams share each weight read
    # At very high concurrency every expert is read each step: the bound flattens towards all weights.
    every_expert = roofline.step_params(config, 10_000)
    assert every_expert == pytest.approx(synth.count_params(config) - config.vocab_size * config.hidden_size, rel=0.01)
