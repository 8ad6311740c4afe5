"""A plan as a fleet (llminfra/planning/fleet.py, chart_values.py): the Helm values of vLLM's
production stack and of llm-d, validated offline against each chart's own JSON Schema
(llminfra/data/schemas/). Valid exports of several plans pass both schemas; broken values fail
with the schema's own message and the JSON path; the values carry the same limits as the plan's
``vllm serve`` line."""

import copy
import dataclasses
import json
import os
import random
import re
import tomllib

import pytest
import yaml

from llminfra.planning import (EngineLimits, PlanPrices, PrefillDecodeSplit, ServiceRequirements,
                               fleet_values, limits_for_plan, plan_deployment, split_for_plan,
                               validate_values, vllm_command)
from llminfra.planning.chart_values import SCHEMA_DIR
from llminfra.planning.fleet import (CHART_SCHEMAS, llm_d_values, load_schema,
                                     production_stack_values, routing_logics, to_yaml,
                                     values_table)

REQ = ServiceRequirements(requests_per_day=50_000, input_tokens=1_500, output_tokens=300,
                          ttft_target_s=1.0, tpot_target_s=0.1, model="llama-3-8b",
                          dtype="bf16", peak_to_mean=3.0)
BIG = dataclasses.replace(REQ, model="llama-3-70b")
PRICES = PlanPrices(3.0, 15.0, gpu_hour_usd=2.69)
SMALL = EngineLimits("HuggingFaceTB/SmolLM2-135M-Instruct", max_num_seqs=4, max_model_len=1000,
                     dtype="fp32")


def _flags(argv):
    return dict(zip(argv[1::2], argv[2::2]))


@pytest.fixture(scope="module")
def plans():
    return {"8b": (plan_deployment(REQ, "h100", PRICES), REQ),
            "70b": (plan_deployment(BIG, "h100", PRICES), BIG)}


def test_the_stored_schemas_say_where_they_come_from():
    sources = json.loads((SCHEMA_DIR / "sources.json").read_text())["charts"]
    assert set(sources) == set(CHART_SCHEMAS)
    for chart, s in sources.items():
        assert s["file"] == CHART_SCHEMAS[chart]
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"])
        assert s["repository"].startswith("https://github.com/")
        assert s["licence"].startswith("Apache-2.0")
        assert load_schema(chart)["$schema"] == s["schema_dialect"]
    assert "Apache License" in (SCHEMA_DIR / "LICENSE-Apache-2.0.txt").read_text()
    pyproject = tomllib.loads((SCHEMA_DIR.parents[2] / "pyproject.toml").read_text())
    assert "data/**/*" in pyproject["tool"]["setuptools"]["package-data"]["llminfra"]


def test_the_router_policies_are_the_charts_own():
    assert {"roundrobin", "session", "prefixaware", "kvaware",
            "disaggregated_prefill"} <= set(routing_logics())


def test_plans_export_as_values_both_charts_accept(plans):
    """The 8B plan on one H100 a replica and the 70B on several; each as it is, split into prefill
    and decode, and (production stack) behind the prefix-aware and the session router."""
    assert plans["8b"][0].tensor_parallel == 1 < plans["70b"][0].tensor_parallel
    for plan, req in plans.values():
        split = split_for_plan(plan, req)
        for chart in CHART_SCHEMAS:
            for s in (None, split):
                values = fleet_values(plan, req, chart, split=s)
                validate_values(yaml.safe_load(to_yaml(values)), chart)   # the file, read back
        for routing, key in (("prefixaware", None), ("session", "x-user-id")):
            values = fleet_values(plan, req, "production-stack", routing=routing,
                                  session_key=key)
            assert values["routerSpec"]["routingLogic"] == routing


def test_production_stack_values_carry_the_plans_command_line(plans):
    plan, req = plans["70b"]
    limits = limits_for_plan(plan, req)
    values = fleet_values(plan, req, "production-stack", routing="prefixaware")
    (spec,) = values["servingEngineSpec"]["modelSpec"]
    flags = _flags(vllm_command(limits)[2:])
    cfg = spec["vllmConfig"]
    assert spec["modelURL"] == vllm_command(limits)[2] == "meta-llama/Meta-Llama-3-70B"
    assert (spec["replicaCount"], spec["requestGPU"]) == (plan.replicas, plan.tensor_parallel)
    assert {"--max-num-seqs": str(cfg["maxNumSeqs"]), "--max-model-len": str(cfg["maxModelLen"]),
            "--dtype": cfg["dtype"], "--tensor-parallel-size": str(cfg["tensorParallelSize"])} \
        == flags
    # the chart's templates require these though its schema does not (its chart.resources helper)
    assert spec["requestCPU"] > 0 and spec["requestMemory"]


def test_llm_d_values_carry_the_plans_command_line(plans):
    plan, req = plans["70b"]
    limits = limits_for_plan(plan, req)
    values = fleet_values(plan, req, "llm-d")
    assert values["profile"] == "optimized-baseline"
    (item,) = values["modelServers"]["items"]
    assert item["args"] == vllm_command(limits)[2:]
    assert item["replicas"] == plan.replicas
    assert item["resources"]["requests"]["nvidia.com/gpu"] == plan.tensor_parallel


def test_a_disaggregated_plan_has_a_prefill_and_a_decode_deployment(plans):
    plan, req = plans["8b"]
    split = PrefillDecodeSplit(prefill_replicas=3, decode_replicas=2, prefill_tensor_parallel=1,
                               decode_tensor_parallel=2)
    ps = fleet_values(plan, req, "production-stack", split=split)
    pre, dec = ps["servingEngineSpec"]["modelSpec"]
    assert ps["routerSpec"]["routingLogic"] == "disaggregated_prefill"
    assert (pre["replicaCount"], pre["requestGPU"], dec["replicaCount"], dec["requestGPU"]) \
        == (3, 1, 2, 2)
    assert (pre["lmcacheConfig"]["kvRole"], dec["lmcacheConfig"]["kvRole"]) \
        == ("kv_producer", "kv_consumer")
    assert ps["routerSpec"]["extraArgs"] == ["--prefill-model-labels", pre["name"],
                                             "--decode-model-labels", dec["name"]]
    ld = fleet_values(plan, req, "llm-d", split=split)
    assert ld["profile"] == "pd-disaggregation"
    roles = {i["role"]: i for i in ld["modelServers"]["items"]}
    assert (roles["prefill"]["replicas"], roles["decode"]["replicas"]) == (3, 2)
    assert _flags(roles["decode"]["args"])["--tensor-parallel-size"] == "2"
    assert "--tensor-parallel-size" not in roles["prefill"]["args"]
    with pytest.raises(ValueError, match="PrefillDecodeSplit"):
        production_stack_values(SMALL, 1, routing="disaggregated_prefill")


def test_random_limits_export_as_valid_values():
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for _ in range(20):
        limits = EngineLimits(rng.choice(["Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B"]),
                              rng.randint(1, 512), rng.randint(16, 131072),
                              rng.choice(["fp32", "bf16", "fp16"]), rng.choice([1, 2, 4, 8]),
                              rng.choice([1, 2]))
        replicas = rng.randint(1, 64)
        routing = rng.choice(["roundrobin", "prefixaware"])
        ps = production_stack_values(limits, replicas, routing=routing)
        ld = llm_d_values(limits, replicas)
        validate_values(ps, "production-stack")
        validate_values(ld, "llm-d")
        assert ps["servingEngineSpec"]["modelSpec"][0]["requestGPU"] == limits.gpus, seed
        assert ld["modelServers"]["items"][0]["args"] == vllm_command(limits)[2:], seed


def _broken(chart, path, value=None, delete=False):
    values = copy.deepcopy(production_stack_values(SMALL, 2) if chart == "production-stack"
                           else llm_d_values(SMALL, 2))
    node = values
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return values


@pytest.mark.parametrize("chart, path, value, delete, message", [
    ("production-stack", ["servingEngineSpec", "modelSpec", 0, "vllmConfig", "tensorParallelSize"],
     "2", False,
     r"\$\.servingEngineSpec\.modelSpec\[0\]\.vllmConfig\.tensorParallelSize: '2' is not of "
     r"type 'integer'"),
    ("production-stack", ["routerSpec", "routingLogic"], "leastload", False,
     r"\$\.routerSpec\.routingLogic: 'leastload' is not one of \['roundrobin', 'session', "
     r"'prefixaware', 'kvaware', 'disaggregated_prefill'"),
    ("production-stack", ["servingEngineSpec", "modelSpec", 0, "vllmConfig",
                          "enablePrefixCaching"], "yes", False, r"'yes' is not of type 'boolean'"),
    ("llm-d", ["modelServers", "items", 0, "role"], None, True,
     r"\$\.modelServers\.items\[0\]: 'role' is a required property"),
    ("llm-d", ["modelServers", "items", 0, "replicas"], -1, False,
     r"\$\.modelServers\.items\[0\]\.replicas: -1 is less than the minimum of 0"),
    ("llm-d", ["profile"], "pd", False, r"'pd' is not one of \['optimized-baseline'"),
    ("llm-d", ["modelServers", "items", 0, "name"], "Decode_1", False,
     r"'Decode_1' does not match"),
])
def test_broken_values_fail_with_the_schemas_message(chart, path, value, delete, message):
    values = _broken(chart, path, value, delete)
    with pytest.raises(ValueError, match=message):
        validate_values(values, chart)


def test_every_error_is_counted():
    values = _broken("production-stack", ["routerSpec", "routingLogic"], "leastload")
    values["routerSpec"]["replicaCount"] = "one"
    with pytest.raises(ValueError, match=r"\(and 1 more\)"):
        validate_values(values, "production-stack")


def test_bad_inputs_name_what_is_allowed(plans):
    plan, req = plans["8b"]
    allowed = r"chart 'kserve'; allowed: \['llm-d', 'production-stack'\]"
    with pytest.raises(ValueError, match=allowed):
        validate_values({}, "kserve")
    with pytest.raises(ValueError, match="allowed"):
        fleet_values(plan, req, "helm")
    with pytest.raises(ValueError, match=r"routing 'kvaware'; allowed: \['roundrobin'"):
        production_stack_values(SMALL, 1, routing="kvaware")
    with pytest.raises(ValueError, match="session_key"):
        production_stack_values(SMALL, 1, routing="session")
    with pytest.raises(ValueError, match="replicas must be an int >= 1"):
        llm_d_values(SMALL, 0)
    with pytest.raises(ValueError, match="decode_replicas"):
        PrefillDecodeSplit(1, 0)


def test_split_for_plan_by_littles_law(plans):
    """50,000 requests a day at 3× the mean: λ = 50,000 / 86,400 · 3 = 1.736 requests/s; a prompt
    that holds a prefill replica 0.6 s keeps 1.736 · 0.6 = 1.04 of them busy: 2 replicas."""
    plan, req = plans["8b"]
    split = split_for_plan(dataclasses.replace(plan, ttft_estimate_s=0.6), req)
    assert (split.prefill_replicas, split.decode_replicas) == (2, plan.replicas)
    assert split.prefill_tensor_parallel == split.decode_tensor_parallel == plan.tensor_parallel
    assert split_for_plan(dataclasses.replace(plan, ttft_estimate_s=0.01), req) \
        .prefill_replicas == 1


def test_the_table_says_what_each_field_means(plans):
    plan, req = plans["8b"]
    rows = {r["field"]: r for r in values_table(fleet_values(plan, req, "llm-d"))}
    gpu = rows["modelServers.items[0].resources.requests.nvidia.com/gpu"]
    assert gpu["value"] == plan.tensor_parallel and "GPUs" in gpu["meaning"]
    assert rows["modelServers.items[0].args"]["value"] \
        == " ".join(vllm_command(limits_for_plan(plan, req))[2:])
    ps = {r["field"]: r["value"] for r in values_table(fleet_values(plan, req, "production-stack"))}
    assert ps["servingEngineSpec.modelSpec[0].vllmConfig.maxNumSeqs"] == plan.batch_per_replica
    assert "router pods" in {r["field"]: r for r in values_table(fleet_values(
        plan, req, "production-stack"))}["routerSpec.replicaCount"]["meaning"]
