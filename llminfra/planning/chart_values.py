"""The charts' own schemas: load them, validate a plan's Helm values, write them as YAML.

Two charts' values schemas are stored under ``llminfra/data/schemas/`` (``sources.json``: each
one's repository, path, commit and licence, Apache-2.0): the vLLM production stack's
(``helm/values.schema.json``, JSON Schema 2020-12) and llm-d-stack's
(``charts/llm-d-stack/values.schema.json``, draft-07). :func:`validate_values` checks values with
``jsonschema`` in the dialect the schema names and reports the schema's own message at its JSON
path; :func:`values_table` says what each field of an export means (:data:`FIELD_MEANINGS`).
:mod:`llminfra.planning.fleet` builds the values. Taught in chapter 10.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "data" / "schemas"
#: chart name -> its values schema under :data:`SCHEMA_DIR` (``sources.json`` says where from)
CHART_SCHEMAS = {"production-stack": "production_stack_values.schema.json",
                 "llm-d": "llm_d_values.schema.json"}


def check_chart(chart: str) -> None:
    """``ValueError`` naming the charts for a name that is not one of :data:`CHART_SCHEMAS`."""
    if chart not in CHART_SCHEMAS:
        raise ValueError(f"chart {chart!r}; allowed: {sorted(CHART_SCHEMAS)}")


def load_schema(chart: str) -> dict:
    """The stored JSON Schema of ``chart``'s values (``ValueError`` naming the charts for an
    unknown one)."""
    check_chart(chart)
    return json.loads((SCHEMA_DIR / CHART_SCHEMAS[chart]).read_text())


def routing_logics() -> list[str]:
    """The production-stack router's ``routingLogic`` values, as its schema lists them."""
    router = load_schema("production-stack")["properties"]["routerSpec"]["properties"]
    return list(router["routingLogic"]["enum"])


@functools.lru_cache(maxsize=None)
def _validator(chart: str):
    """A ``jsonschema`` validator of ``chart``'s schema in the dialect the schema names (llm-d's
    writes draft-07's URI with ``https``; ``jsonschema`` knows it as ``http``)."""
    from jsonschema import validators
    schema = load_schema(chart)
    dialect = schema.get("$schema", "")
    cls = (validators.validator_for(schema, default=None)
           or validators.validator_for({"$schema": dialect.replace("https://", "http://", 1)},
                                       default=None))
    if cls is None:
        raise ValueError(f"{chart}'s schema names a dialect jsonschema does not know: {dialect!r}")
    cls.check_schema(schema)
    return cls(schema)


def validate_values(values: dict, chart: str) -> None:
    """Check ``values`` against ``chart``'s stored schema with ``jsonschema`` (the dialect the
    schema names). ``ValueError`` on failure: the JSON path and the schema's own message of the
    most relevant error (``jsonschema.exceptions.best_match``), and how many there are."""
    from jsonschema import exceptions
    check_chart(chart)
    errors = list(_validator(chart).iter_errors(values))
    if errors:
        e = exceptions.best_match(errors)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"{chart} values invalid at {e.json_path}: {e.message}{more}")


def to_yaml(values: dict) -> str:
    """``values`` as the YAML file ``helm install -f`` reads (PyYAML; keys in the order built,
    every repeated object written out again rather than as an alias)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    return yaml.dump(values, Dumper=Dumper, sort_keys=False, default_flow_style=False)


#: what a field of the exported values means, and where its value comes from (plan / input);
#: keyed by the field's name, or by its whole path where the name means two things
FIELD_MEANINGS = {
    "name": "the deployment's name; its Kubernetes objects are named after it",
    "repository": "engine container image (input)",
    "tag": "engine image tag (input)",
    "modelURL": "the model each engine loads (vllm serve MODEL): the plan's model",
    "replicaCount": "pods of this deployment: the plan's replicas",
    "requestGPU": "GPUs each pod requests: the plan's tensor × pipeline parallel size",
    "requestCPU": "CPU cores each pod requests (input: a GPU plan does not size it)",
    "requestMemory": "host memory each pod requests (input)",
    "tensorParallelSize": "--tensor-parallel-size: GPUs each layer is split over (the plan's)",
    "maxModelLen": "--max-model-len: the longest request, prompt + answer (the requirements')",
    "maxNumSeqs": "--max-num-seqs: sequences batched at once (the plan's batch at the peak)",
    "dtype": "--dtype: the weights' number format (the requirements')",
    "enablePrefixCaching": "reuse the KV cache of a prompt prefix already computed (input: on)",
    "enableChunkedPrefill": "split long prompts into chunks scheduled beside decode steps "
                            "(input: on)",
    "enableRouter": "run the stack's router in front of the engines",
    "routerSpec.replicaCount": "router pods (input: one)",
    "routingLogic": "the router's policy: which engine gets a request",
    "sessionKey": "the request header that names a session (session routing)",
    "kvRole": "LMCache's role: kv_producer (prefill) or kv_consumer (decode)",
    "profile": "llm-d's guide: the router's scoring and how the model servers are laid out",
    "role": "llm-d's role of these pods: decode (whole requests, or answers) or prefill",
    "replicas": "pods of this model server: the plan's replicas (or the split's)",
    "args": "vllm serve's arguments: the plan's command line after 'vllm serve'",
    "nvidia.com/gpu": "GPUs each pod requests: the plan's tensor × pipeline parallel size",
}


def values_table(values: dict) -> list[dict]:
    """Every field of ``values`` that :data:`FIELD_MEANINGS` explains (by its path, else its
    name), as rows of ``field`` (its path), ``value`` (a list of strings joined by spaces) and
    ``meaning``."""
    rows = []

    def walk(node, path, key):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else k, k)
        elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]", key)
        elif (meaning := FIELD_MEANINGS.get(path, FIELD_MEANINGS.get(key))) is not None:
            value = " ".join(node) if isinstance(node, list) else node
            rows.append({"field": path, "value": value, "meaning": meaning})

    walk(values, "", None)
    return rows


__all__ = ["CHART_SCHEMAS", "FIELD_MEANINGS", "SCHEMA_DIR", "check_chart", "load_schema",
           "routing_logics", "to_yaml", "validate_values", "values_table"]
