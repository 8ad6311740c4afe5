"""Communication model of tensor parallelism, worked by hand."""

import pytest

from llminfra.calc.communication import (allreduce_bytes, allreduce_bytes_per_layer,
                                         communication_share, compute_time_s, get_interconnect,
                                         interconnects, pcie_claim_table, ring_allreduce_time_s,
                                         step_tokens)


def test_allreduce_bytes_by_hand():
    """Llama-2-70B, h = 8192, bf16: decode batch 1 -> 8192 · 2 = 16,384 B per all-reduce,
    32,768 B per layer; prefill 2048 tokens -> 2048 · 8192 · 2 = 33,554,432 B per all-reduce."""
    assert allreduce_bytes("llama-2-70b", 1) == 16_384
    assert allreduce_bytes_per_layer("llama-2-70b", 1) == 32_768
    assert allreduce_bytes("llama-2-70b", step_tokens("prefill", 1, 2048)) == 33_554_432
    assert allreduce_bytes("llama-2-7b", 4, "fp32") == 4 * 4096 * 4
    assert step_tokens("decode", 32, 2048) == 32 and step_tokens("prefill", 2, 100) == 200


def test_ring_time_by_hand():
    """1 GB over 4 GPUs at 32 GB/s: 2·3/4 · 1e9 / 32e9 = 46.875 ms; + 6 steps of 5 µs."""
    assert ring_allreduce_time_s(1e9, 4, 32e9) == pytest.approx(0.046875)
    assert ring_allreduce_time_s(1e9, 4, 32e9, 5e-6) == pytest.approx(0.046875 + 30e-6)
    assert ring_allreduce_time_s(1e9, 1, 32e9, 1.0) == 0.0
    # the bandwidth term approaches 2 · bytes / B for many GPUs
    assert ring_allreduce_time_s(1e9, 1000, 1e9) == pytest.approx(2 * 0.999)
    with pytest.raises(ValueError):
        ring_allreduce_time_s(1e9, 0, 32e9)
    with pytest.raises(ValueError):
        ring_allreduce_time_s(1e9, 2, 0)


def test_interconnects_come_from_the_catalog_halved():
    """A100 NVLink 3: 600 GB/s both directions -> 300 GB/s each; H100 NVLink 4: 450 GB/s;
    PCIe Gen4 x16: 64 -> 32 GB/s; Gen5: 128 -> 64 GB/s; NDR 400 Gb/s = 50 GB/s."""
    links = interconnects()
    assert links["nvlink-a100"].bytes_per_s == 300e9
    assert links["nvlink-h100"].bytes_per_s == 450e9
    assert links["pcie-gen4"].bytes_per_s == 32e9
    assert links["pcie-gen5"].bytes_per_s == 64e9
    assert links["infiniband-ndr"].bytes_per_s == 50e9
    assert all(link.source for link in links.values())
    with pytest.raises(KeyError, match="known: nvlink-a100"):
        get_interconnect("carrier-pigeon")


def test_share_of_70b_prefill_on_pcie_gen4_by_hand():
    """Llama-2-70B (68,976,648,192 params, 80 layers), prefill 2048 tokens, 4 × A100-80GB, PCIe
    Gen4, peak compute: FLOPs 2·P·2048 = 2.8253e14, / (4 · 312e12) = 226.4 ms; comm
    160 · 1.5 · 33,554,432 / 32e9 = 251.7 ms; share 251.7 / 478.1 = 0.5265."""
    d = communication_share("llama-2-70b", "a100-80gb", 4, "pcie-gen4", "prefill")
    assert d["comm_s"] == pytest.approx(160 * 1.5 * 33_554_432 / 32e9)
    assert d["compute_s"] == pytest.approx(2 * 68_976_648_192 * 2048 / (4 * 312e12))
    assert d["share"] == pytest.approx(0.5265, abs=1e-3)


def test_decode_is_memory_bound_and_latency_dominated():
    """Decode at batch 1 reads all weights (137.95 GB in bf16) once per token: on 4 A100-80GB
    (2039 GB/s each) 16.9 ms + the KV cache; the all-reduces carry only 16 KB each, so without
    latency communication is < 1 % of the step, and α = 5 µs per ring step makes it ~22 %."""
    t = compute_time_s("llama-2-70b", "a100-80gb", 4, "decode", context=1)
    assert t == pytest.approx((68_976_648_192 * 2 + 2 * 80 * 8 * 128 * 2) / (4 * 2039e9))
    no_lat = communication_share("llama-2-70b", "a100-80gb", 4, "pcie-gen4", "decode")
    assert no_lat["share"] < 0.01
    lat = communication_share("llama-2-70b", "a100-80gb", 4, "pcie-gen4", "decode",
                              latency_s=5e-6)
    assert lat["comm_s"] == pytest.approx(no_lat["comm_s"] + 160 * 6 * 5e-6)
    assert 0.15 < lat["share"] < 0.3


def test_claim_table_holds_only_for_pcie_prefill():
    rows = pcie_claim_table()
    at_least = {(r["phase"], r["batch"], r["n_gpus"], r["interconnect"])
                for r in rows if r["at_least_40"]}
    assert ("prefill", 1, 4, "pcie-gen4") in at_least
    assert ("prefill", 1, 8, "pcie-gen4") in at_least
    assert not any(link == "nvlink-a100" for *_, link in at_least)
    assert not any(phase == "decode" for phase, *_ in at_least)  # α = 0: bandwidth only
    shares = [r["share"] for r in rows]
    assert all(0 <= s < 1 for s in shares)


def test_bad_inputs():
    with pytest.raises(ValueError, match="phase"):
        step_tokens("training")
    with pytest.raises(ValueError, match="batch"):
        communication_share("llama-2-70b", "a100-80gb", 4, "pcie-gen4", "decode", batch=0)
    with pytest.raises(KeyError):
        communication_share("llama-2-70b", "a100-80gb", 4, "pcie-gen6", "decode")


def test_dtype_without_a_peak_is_named():
    """The A100 has no fp8 tensor cores: the catalog's fp8 peak is empty, and the error says
    which dtypes do have one instead of failing on ``None * 1e12``."""
    with pytest.raises(ValueError, match="no 'fp8' peak for a100-80gb.*bf16"):
        compute_time_s("llama-2-7b", "a100-80gb", 2, "decode", dtype="fp8")
