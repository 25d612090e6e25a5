"""Patches 0290 (PB_FUSED_ROPE), 0300 (PB_FUSED_NORM) and 0310 (PB_FUSED_PROJ) against upstream's
rotary embedding, RMSNorm and separate projections.

Triton runs through its CPU interpreter in a fresh interpreter process. The rotation must give
upstream's bits in float32, float16 and bfloat16 (decode and prefill shapes, batch > 1 with a
shared cos, GQA, full and partial rotary) with upstream's strides; the norm must stay within a
float32 rounding of upstream's and keep its dtype rules. Then the tiny model's greedy reply with
both on; the fused projections on the tiny model; and a served tiny model whose load hooks
install all three.
"""

import pytest

from .conftest import engine_job

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def report(patched_engine, tiny_model):
    return engine_job("fused_layers_job.py", patched_engine, tiny_model, TRITON_INTERPRET="1",
                      PB_FUSED_ROPE="1", PB_FUSED_NORM="1", PB_FUSED_PROJ="1")


def test_the_knobs_replace_the_modeling_functions_at_load_only_when_on(report):
    assert report["off_keeps_upstream"] and report["on_installs"]


def test_the_rotation_gives_upstreams_bits_and_strides(report):
    assert len(report["rope"]) == 18
    for row in report["rope"]:
        assert row["fits"] and row["changed"], row
        assert row["equal"] and row["strides"], row


def test_a_layout_the_rotation_does_not_take_runs_upstreams(report):
    assert report["rope_other_layout"] == {"fits": False, "equal": True}


def test_the_norm_stays_within_a_rounding_of_upstreams(report):
    assert len(report["norm"]) == 18
    for row in report["norm"]:
        assert row["fits"] and row["same_dtype"] and row["same_shape"], row
        if row["dtype"] == "torch.float32":
            assert row["max_rel_diff"] < 1e-6, row  # the variance's last bits
        else:  # the rounding to 16 bits absorbs them: at most one element in a hundred moves, by at
            # most two steps (the normalised value's, then the weight product's)
            assert row["share_differing"] <= 0.01 and row["max_rel_diff"] <= 2 ** -6, row


def test_the_tiny_models_greedy_reply_is_unchanged_with_both_kernels_running(report):
    assert report["tiny_greedy_equal"] and report["tiny_new_tokens"] == 24
    steps = report["tiny_new_tokens"]  # one prefill and 23 decode steps
    assert report["tiny_calls"] == {"rope": steps * report["tiny_layers"],
                                    "norm": steps * (2 * report["tiny_layers"] + 1)}


def test_the_fused_projections_give_the_tiny_models_logits_without_a_second_copy(report):
    proj = report["proj"]
    assert proj["views"] and proj["same_params"], proj  # the originals are views of the fused rows
    assert proj["max_logit_diff"] <= 1e-5 and proj["greedy_equal"], proj
    assert proj["fused"] == [True, True] and proj["restored_equal"], proj  # restore: the separate GEMMs again


def test_projections_that_are_not_plain_linear_layers_stay_apart(report):
    assert report["proj_other_layers"] == {"attention_fused": False, "mlp_fused": True}


def test_a_served_model_takes_all_three_at_load_and_replies_as_upstream(patched_engine, tiny_model, server_off,
                                                                 tmp_path, monkeypatch):
    """Through `transformers serve`: the model manager's load hooks install all three (the log
    says so) and the greedy replies to the exactness prompts equal the knobs-off server's."""
    from patchbay.measure import exact

    from .conftest import Server

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels run on the CPU through the interpreter
    # PB_TOKENIZE (same bits) lets the comparison name the reply tokens with this server's tokenizer
    knobs = {"PB_FUSED_ROPE": "1", "PB_FUSED_NORM": "1", "PB_FUSED_PROJ": "1", "PB_TOKENIZE": "1"}
    server = Server(patched_engine, tiny_model, knobs, tmp_path / "run")
    try:
        log = server.files.log.read_text()
        assert "patchbay: PB_FUSED_ROPE:" in log and "patchbay: PB_FUSED_NORM:" in log, log[-2000:]
        assert "PB_FUSED_PROJ: fused q/k/v in 2 attention layers and gate/up in 2 MLPs (0 left" in log
        rows = exact.check_servers(server.url, server_off.url, server_off.model, max_tokens=24)
        assert len(rows) == 8 and all(r["equal"] for r in rows), rows
    finally:
        server.stop()
