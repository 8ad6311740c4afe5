"""A plan as a fleet: the Helm values of vLLM's production stack and of llm-d, checked offline.

A team does not type ``vllm serve`` on each machine; it installs a Helm chart and hands it a
values file. Two charts carry a plan as it stands:

- **vLLM production stack** (``vllm-project/production-stack``, chart ``vllm-stack``): one
  ``servingEngineSpec.modelSpec`` entry per deployment of engines (``replicaCount`` pods, each
  ``requestGPU`` GPUs, ``vllmConfig`` = the engine's flags) and a ``routerSpec`` whose
  ``routingLogic`` picks the router's policy (round robin, session, prefix-aware, KV-aware,
  disaggregated prefill);
- **llm-d** (``llm-d/llm-d``, chart ``llm-d-stack``): a ``profile`` (``optimized-baseline``, or
  ``pd-disaggregation`` where prefill and decode run on separate replicas) and
  ``modelServers.items``, one per role, each ``replicas`` pods running ``vllm serve`` with
  ``args``.

:func:`production_stack_values` and :func:`llm_d_values` write one replica's
:class:`~llminfra.planning.commands.EngineLimits` and the number of replicas as those values (plain
dicts; :func:`to_yaml` writes the file), :func:`fleet_values` does it for a
:class:`~llminfra.planning.plan.Plan`, and :func:`validate_values` checks them against the chart's
own JSON Schema (:mod:`llminfra.planning.chart_values`), stored under ``llminfra/data/schemas/``
with its repository, commit and licence (``sources.json``). A schema checks types and names, not
everything a chart's templates need: production-stack's templates also require ``requestCPU``
and ``requestMemory``, which a GPU plan does not size, so they are inputs here. Disaggregated
prefill (chapter 11; Zhong et al. 2024, DistServe, arXiv:2401.09670) is a
:class:`PrefillDecodeSplit`. Taught in chapter 10.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from llminfra.planning.chart_values import (CHART_SCHEMAS, FIELD_MEANINGS, check_chart,
                                            load_schema, routing_logics, to_yaml,
                                            validate_values, values_table)
from llminfra.planning.commands import VLLM_DTYPES, EngineLimits, limits_for_plan, vllm_command
from llminfra.planning.plan import Plan
from llminfra.planning.requirements import ServiceRequirements, traffic

#: the engine image: llm-d-stack's own default (charts/llm-d-stack/values.yaml at the stored commit)
ENGINE_IMAGE = ("vllm/vllm-openai", "v0.23.0")
#: production-stack's disaggregated prefill moves the KV cache with LMCache: its default engine
#: image, which has LMCache (helm/values.yaml at the stored commit)
LMCACHE_ENGINE_IMAGE = ("lmcache/vllm-openai", "latest")
#: llm-d's pd-disaggregation profile: the decode pod's sidecar that sends a request to a prefill
#: pod first, the port vLLM moves to behind it, NIXL's side-channel port (profile at the commit)
LLM_D_PD_SIDECAR = "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.9.1"
LLM_D_DECODE_VLLM_PORT, LLM_D_NIXL_PORT = 8200, 5600
#: the production-stack router policies :func:`production_stack_values` writes (of its schema's)
EXPORTED_ROUTING = ("roundrobin", "session", "prefixaware", "disaggregated_prefill")


@dataclass(frozen=True)
class PrefillDecodeSplit:
    """Prefill and decode on separate replicas: ``prefill_replicas`` of
    ``prefill_tensor_parallel`` GPUs run the prompts and hand each request's KV cache to one of
    ``decode_replicas`` of ``decode_tensor_parallel`` GPUs, which generate the answer
    (disaggregated prefill: Zhong et al. 2024, DistServe, arXiv:2401.09670; chapter 11)."""

    prefill_replicas: int
    decode_replicas: int
    prefill_tensor_parallel: int = 1
    decode_tensor_parallel: int = 1

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f.name} must be an int >= 1, got {v!r}")


def split_for_plan(plan: Plan, req: ServiceRequirements) -> PrefillDecodeSplit:
    """A prefill / decode split of ``plan``: decode keeps the plan's replicas and tensor-parallel
    size; prefill gets, by Little's law with the time a prompt occupies a replica (the plan's
    TTFT, one prompt at a time: a prefill is compute-bound, so batching prompts does not
    shorten it), ``ceil(peak requests/s · TTFT)`` replicas of the same size."""
    busy = traffic(req).peak_requests_per_s * plan.ttft_estimate_s
    return PrefillDecodeSplit(max(1, math.ceil(busy - 1e-9)), plan.replicas,
                              plan.tensor_parallel, plan.tensor_parallel)


def _name(model: str) -> str:
    """A Kubernetes name from a Hugging Face id:
    ``meta-llama/Meta-Llama-3-8B`` -> ``meta-llama-3-8b``."""
    name = re.sub(r"[^a-z0-9]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-")
    return name[:40].rstrip("-") or "model"


def _model_spec(limits: EngineLimits, name: str, replicas: int, image: tuple[str, str],
                prefix_caching: bool, chunked_prefill: bool, request_cpu: int,
                request_memory: str) -> dict:
    """One ``servingEngineSpec.modelSpec`` entry: ``replicas`` pods of ``limits``' engine."""
    vllm = {"tensorParallelSize": limits.tensor_parallel, "maxModelLen": limits.max_model_len,
            "maxNumSeqs": limits.max_num_seqs, "dtype": VLLM_DTYPES[limits.dtype],
            "enablePrefixCaching": prefix_caching, "enableChunkedPrefill": chunked_prefill}
    if limits.pipeline_parallel > 1:               # the schema has no field for it
        vllm["extraArgs"] = ["--pipeline-parallel-size", str(limits.pipeline_parallel)]
    return {"name": name, "repository": image[0], "tag": image[1], "modelURL": limits.model,
            "replicaCount": replicas, "requestGPU": limits.gpus, "requestCPU": request_cpu,
            "requestMemory": request_memory, "vllmConfig": vllm}


def production_stack_values(limits: EngineLimits, replicas: int, *, routing: str | None = None,
                            split: PrefillDecodeSplit | None = None, session_key: str | None = None,
                            prefix_caching: bool = True, chunked_prefill: bool = True,
                            request_cpu: int = 8, request_memory: str = "64Gi",
                            release: str = "vllm") -> dict:
    """``replicas`` engines of ``limits`` as the production stack's values.

    ``routing`` is the router's ``routingLogic``, one of :data:`EXPORTED_ROUTING` (default
    ``"roundrobin"``; ``"session"`` needs ``session_key``, the request header that names a
    session; ``"prefixaware"`` sends a prompt to the engine that saw its prefix). With
    ``split`` there are two ``modelSpec`` entries, ``<name>-prefill`` and ``<name>-decode``,
    whose LMCache moves the KV cache from one to the other (``kvRole`` producer / consumer
    over NIXL, as the chart's disaggregated-prefill example sets it), and the router's
    ``routingLogic`` is ``"disaggregated_prefill"``; ``release`` is the Helm release name the
    decode service is named after. ``request_cpu`` / ``request_memory`` are each pod's CPU and
    memory requests."""
    _positive_int("replicas", replicas)
    routing = routing or ("disaggregated_prefill" if split else "roundrobin")
    if routing not in EXPORTED_ROUTING:
        other = [r for r in routing_logics() if r not in EXPORTED_ROUTING]
        raise ValueError(f"routing {routing!r}; allowed: {list(EXPORTED_ROUTING)} (the chart "
                         f"also has {other}, which need an LMCache controller or an "
                         f"orchestrator this export does not configure)")
    if (routing == "disaggregated_prefill") != (split is not None):
        raise ValueError("routing 'disaggregated_prefill' goes with a PrefillDecodeSplit and "
                         f"only with one; got routing {routing!r}, split {split!r}")
    if routing == "session" and not session_key:
        raise ValueError("routing 'session' needs session_key, the header that names a session")
    name = _name(limits.model)
    kw = dict(prefix_caching=prefix_caching, chunked_prefill=chunked_prefill,
              request_cpu=request_cpu, request_memory=request_memory)
    router = {"enableRouter": True, "replicaCount": 1, "routingLogic": routing}
    if session_key:
        router["sessionKey"] = session_key
    if split is None:
        specs = [_model_spec(limits, name, replicas, ENGINE_IMAGE, **kw)]
    else:
        specs = _production_stack_pd(limits, name, split, release, kw)
        router["extraArgs"] = ["--prefill-model-labels", specs[0]["name"],
                               "--decode-model-labels", specs[1]["name"]]
    return {"servingEngineSpec": {"enableEngine": True, "modelSpec": specs}, "routerSpec": router}


def _production_stack_pd(limits, name, split, release, kw) -> list[dict]:
    """The prefill and the decode ``modelSpec`` of a disaggregated plan."""
    nixl = {"enabled": True, "enablePD": True, "enableNixl": True, "nixlPeerPort": "55555",
            "nixlBufferSize": "1073741824", "nixlBufferDevice": "cuda", "nixlEnableGc": True}
    specs = []
    for role, n, tp in (("prefill", split.prefill_replicas, split.prefill_tensor_parallel),
                        ("decode", split.decode_replicas, split.decode_tensor_parallel)):
        spec = _model_spec(dataclasses.replace(limits, tensor_parallel=tp), f"{name}-{role}", n,
                           LMCACHE_ENGINE_IMAGE, **kw)
        spec["labels"] = {"model": spec["name"]}
        spec["lmcacheConfig"] = {**nixl, **(
            {"kvRole": "kv_producer", "nixlRole": "sender",
             "nixlPeerHost": f"{release}-{name}-decode-engine-service"} if role == "prefill" else
            {"kvRole": "kv_consumer", "nixlRole": "receiver", "nixlPeerHost": "0.0.0.0"})}
        specs.append(spec)
    return specs


def _gpus(n: int) -> dict:
    return {"limits": {"nvidia.com/gpu": n}, "requests": {"nvidia.com/gpu": n}}


def llm_d_values(limits: EngineLimits, replicas: int, *,
                 split: PrefillDecodeSplit | None = None) -> dict:
    """``replicas`` engines of ``limits`` as llm-d-stack's values.

    Without ``split``: profile ``optimized-baseline``, one ``decode`` model server (llm-d's name
    for the role of a replica that runs whole requests) whose ``args`` are the plan's
    ``vllm serve`` line after ``vllm serve`` (the chart's command). With ``split``: profile
    ``pd-disaggregation``, a ``prefill`` and a ``decode`` server whose engines move the KV cache
    over NIXL, the decode pods behind the profile's routing sidecar. Install it after the
    profile's own file (``-f profiles/<profile>.yaml -f plan.yaml``): that file holds the
    router's configuration; these values replace its model servers."""
    _positive_int("replicas", replicas)
    profile = "pd-disaggregation" if split else "optimized-baseline"
    if split is None:
        items = [{"name": "decode", "enabled": True, "role": "decode", "replicas": replicas,
                  "args": vllm_command(limits)[2:], "resources": _gpus(limits.gpus)}]
    else:
        items = [_llm_d_pd_item(dataclasses.replace(limits, tensor_parallel=tp), role, n)
                 for role, n, tp in (("prefill", split.prefill_replicas,
                                      split.prefill_tensor_parallel),
                                     ("decode", split.decode_replicas,
                                      split.decode_tensor_parallel))]
    labels = {"llm-d.ai/model": _name(limits.model), "llm-d.ai/guide": profile}
    return {"profile": profile,
            "modelServers": {"enabled": True, "defaultLabels": labels, "items": items}}


def _llm_d_pd_item(limits: EngineLimits, role: str, replicas: int) -> dict:
    """A ``prefill`` or ``decode`` model server of the pd-disaggregation profile: vLLM with the
    NIXL connector; a decode pod's vLLM listens behind the routing sidecar."""
    port = LLM_D_DECODE_VLLM_PORT if role == "decode" else 8000
    args = vllm_command(limits)[2:] + [
        "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    item = {"name": role, "enabled": True, "role": role, "replicas": replicas,
            "args": args + ([f"--port={port}"] if role == "decode" else []),
            "env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                     "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "modelserver", "containerPort": port, "protocol": "TCP"},
                      {"name": "nixl", "containerPort": LLM_D_NIXL_PORT, "protocol": "TCP"}],
            "resources": _gpus(limits.gpus)}
    if role == "decode":
        item["initContainers"] = [{
            "name": "routing-proxy", "image": LLM_D_PD_SIDECAR, "restartPolicy": "Always",
            "args": ["--port=8000", f"--vllm-port={port}", "--kv-connector=nixlv2"],
            "ports": [{"containerPort": 8000, "name": "sidecar", "protocol": "TCP"}]}]
    return item


def fleet_values(plan: Plan, req: ServiceRequirements, chart: str, *,
                 split: PrefillDecodeSplit | None = None, **options) -> dict:
    """``plan`` (made for ``req``) as ``chart``'s values (a name of :data:`CHART_SCHEMAS`): one
    replica's limits from :func:`~llminfra.planning.commands.limits_for_plan`, ``plan.replicas``
    of them, or ``split``'s replicas; ``options`` go to :func:`production_stack_values`.
    Validated before it is returned (:func:`~llminfra.planning.chart_values.validate_values`)."""
    check_chart(chart)
    limits = limits_for_plan(plan, req)
    if chart == "production-stack":
        values = production_stack_values(limits, plan.replicas, split=split, **options)
    else:
        if options:
            raise ValueError(f"llm-d values take no options; got {sorted(options)}")
        values = llm_d_values(limits, plan.replicas, split=split)
    validate_values(values, chart)
    return values


def _positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")


__all__ = ["CHART_SCHEMAS", "EXPORTED_ROUTING", "FIELD_MEANINGS", "PrefillDecodeSplit",
           "fleet_values", "llm_d_values", "load_schema", "production_stack_values",
           "routing_logics", "split_for_plan", "to_yaml", "validate_values", "values_table"]
