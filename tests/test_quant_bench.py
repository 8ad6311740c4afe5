"""The quant bench on the trained tiny model: JSON keyed by scheme, and the issue's targets."""

import json

import pytest
import torch


@pytest.mark.slow
def test_quick_bench_keys_and_targets():
    from llminfra.bench import quant as bq
    from llminfra.model import load_tiny
    model, _ = load_tiny()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = bq.measure(model.float().eval(), quick=True,
                       schemes=("int8-channel", "int4-g128", "gptq-int4-g128", "awq-int4-g128"))
    finally:
        torch.set_num_threads(before)
    json.dumps(r)
    for s in ("int8-channel", "int4-g128", "gptq-int4-g128", "awq-int4-g128"):
        assert {"bytes_per_param", "layer_rel_error", "perplexity", "perplexity_delta",
                "greedy_agreement"} <= set(r[s])
    assert r["int4-g128"]["bytes_per_param"] <= 0.54
    assert r["int8-channel"]["layer_rel_error"] <= 0.01
    assert r["gptq-int4-g128"]["layer_rel_error"] <= 0.5 * r["int4-g128"]["layer_rel_error"]
    o = r["outlier_layer"]
    assert o["awq-int4-g128"] <= 0.7 * o["int4-g128"]
    assert r["kv_cache"]["int8"]["bytes_per_token"] < r["kv_cache"]["fp32"]["bytes_per_token"] / 3
    text = bq.format_table(r)
    assert "gptq-int4-g128" in text and "outlier layer" in text
