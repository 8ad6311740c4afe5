"""A deployment plan for one GPU type: source 000's five steps, each with its numbers.

1. **memory** — does the model fit, how many sequences fit beside it
   (:func:`llminfra.calc.memory.kv_budget`, :func:`~llminfra.planning.sizing.gpus_for_memory`);
2. **engine and batching** — the batch the KV cache allows at the peak, and the per-replica
   decode throughput and time per output token at that batch (roofline bounds,
   :mod:`llminfra.calc.roofline`, turned into vLLM's latency by efficiencies fitted to NVIDIA
   AIConfigurator's estimates, :func:`llminfra.planning.predict.predict_latency`; chapter 05's
   simulator and load test refine them);
3. **hardware** — GPUs per replica (tensor parallelism 1, 2, 4, 8) and replicas for the peak;
4. **cost** — rented GPUs around the clock vs the hosted API at the same volume
   (:mod:`llminfra.calc.cost`), utilisation, and whether the recommendation fits the budget
   (``Plan.within_budget``, and a reason that says by how much);
5. **load test** — left to a real run (chapter 05's ``loadtest``); the plan says what to measure.

PlanPrices are inputs (:class:`PlanPrices`); the course's examples are labelled with their date.
Roofline figures are upper bounds on speed: a real engine reaches a fraction of them (chapter 10
shows the fitted fractions on GPUs and the ones measured on the CPU). Taught in chapter 10.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType

from llminfra.calc import cost as cost_model
from llminfra.calc.memory import DEFAULT_RESERVE_FRACTION, kv_budget
from llminfra.calc.roofline import decode_time_per_token_s, ttft_s
from llminfra.planning.predict import predict_latency
from llminfra.planning.requirements import ServiceRequirements, traffic
from llminfra.specs import get_gpu

#: tensor-parallel sizes a replica may use (GPUs in one server)
TP_SIZES = (1, 2, 4, 8)


#: example rental prices, USD per GPU hour, by GPU type: inputs, not current prices. RunPod's
#: on-demand prices, March 2026, as deploybase.ai tabulates them in "Spot GPU Pricing"
#: (on-demand column: A100 PCIe 1.19, A100 SXM 1.39, H100 PCIe 1.99, H100 SXM 2.69, H200 3.59,
#: L40S 0.79, RTX 4090 0.34; spot 35-70 % lower). Its "RunPod GPU Pricing: 2026 Comprehensive
#: Pricing Guide" (2026-03-10) prints the same figures under a "Spot" heading, but RunPod's
#: Secure Cloud (RunPod's own, non-interruptible) H100 SXM is 2.69 in spheron.network's "RunPod
#: H100 Pricing 2026" too, the source chapter 09 quotes: an on-demand price, here as there. The
#: RTX 3090's 0.22 is from the pricing guide only. GPUs without a listed price have none here.
EXAMPLE_GPU_HOUR_USD = MappingProxyType({
    "rtx-3090": 0.22, "rtx-4090": 0.34, "l40s": 0.79, "a100-80gb-pcie": 1.19, "a100-80gb": 1.39,
    "h100-pcie": 1.99, "h100": 2.69, "h200": 3.59})
EXAMPLE_GPU_HOUR_LABEL = ("RunPod on-demand GPU-hour prices by GPU type, 2026-03 (deploybase.ai; "
                          "the H100's 2.69 is chapter 09's example)")


@dataclass(frozen=True)
class PlanPrices:
    """Prices the plan compares, as inputs: a hosted API's USD per million input / output tokens
    and a rented GPU's USD per hour — one price for every GPU (``gpu_hour_usd``) and / or one per
    GPU type (``gpu_hour_usd_by_gpu``, which comes first). ``label`` says where they come from and
    when."""

    api_input_per_million: float
    api_output_per_million: float
    gpu_hour_usd: float | None = None
    label: str = "example prices (inputs, not current prices)"
    gpu_hour_usd_by_gpu: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("api_input_per_million", "api_output_per_million", "gpu_hour_usd"):
            v = getattr(self, name)
            if v is None and name == "gpu_hour_usd":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        by_gpu = {}
        for gpu, v in dict(self.gpu_hour_usd_by_gpu).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"gpu_hour_usd_by_gpu[{gpu!r}] must be a finite number >= 0, "
                                 f"got {v!r}")
            by_gpu[get_gpu(gpu).name] = float(v)          # KeyError for an unknown GPU
        if self.gpu_hour_usd is None and not by_gpu:
            raise ValueError("give a GPU-hour price: gpu_hour_usd, gpu_hour_usd_by_gpu or both")
        object.__setattr__(self, "gpu_hour_usd_by_gpu", MappingProxyType(by_gpu))

    def gpu_hour(self, gpu: str) -> float:
        """USD per hour of one ``gpu``: its own price if given, else ``gpu_hour_usd``; a
        ``KeyError`` naming the GPU and the priced ones if neither."""
        name = get_gpu(gpu).name
        if name in self.gpu_hour_usd_by_gpu:
            return self.gpu_hour_usd_by_gpu[name]
        if self.gpu_hour_usd is None:
            raise KeyError(f"no GPU-hour price for {name!r}: priced are "
                           f"{sorted(self.gpu_hour_usd_by_gpu)}; add it to gpu_hour_usd_by_gpu "
                           f"or give gpu_hour_usd for every GPU")
        return float(self.gpu_hour_usd)


@dataclass(frozen=True)
class Plan:
    """The numbers behind a plan for ``req`` on ``gpu`` (see the module docstring)."""

    gpu: str
    tensor_parallel: int
    replicas: int
    total_gpus: int
    fits: bool
    max_sequences_per_replica: int
    peak_concurrency: int
    batch_per_replica: int
    ttft_estimate_s: float
    tpot_estimate_s: float
    replica_tokens_per_s: float
    peak_output_tokens_per_s: float
    utilization: float
    gpu_hour_usd: float
    selfhost_monthly_usd: float
    api_monthly_usd: float
    selfhost_usd_per_million: float
    api_usd_per_million: float
    recommendation: str
    reasons: tuple[str, ...]
    checklist: tuple[dict, ...] = field(default_factory=tuple)
    budget_usd_per_month: float = math.inf
    recommended_monthly_usd: float = 0.0

    @property
    def within_budget(self) -> bool:
        """The recommended option's monthly cost is at most the requirements' budget."""
        return self.recommended_monthly_usd <= self.budget_usd_per_month

    def to_dict(self) -> dict:
        return {**asdict(self), "within_budget": self.within_budget}


#: one share of the roofline bound for TTFT and TPOT alike: what the planner assumed before its
#: fitted efficiencies (:func:`~llminfra.planning.predict.predict_latency`), and what the serving
#: simulator (:func:`~llminfra.planning.simulate.simulate_peak`) still divides a step by. An
#: assumption: chapter 10 puts it beside AIConfigurator's estimates and the CPU engines' measured
#: shares (``compare_engines_cpu.json``), far from both; pass ``efficiency=`` to plan with it.
DEFAULT_EFFICIENCY = 0.5


def _latency(req: ServiceRequirements, gpu: str, tp: int, batch: int,
             efficiency: float | None) -> tuple[float, float]:
    """``(TTFT, TPOT)`` of a replica: one prompt's prefill when idle, a decode step of ``batch``
    sequences. Fitted (``efficiency=None``: :func:`predict_latency`, decode at the output's
    mean context) or the bounds divided by ``efficiency`` (the output layer once in the
    prefill, ``logits="last"``; decode at the full context)."""
    if efficiency is None:
        kw = {"tensor_parallel": tp, "input_tokens": req.input_tokens,
              "output_tokens": req.output_tokens, "dtype": req.dtype}
        return (predict_latency(req.model, gpu, batch=1, **kw)["ttft_s"],
                predict_latency(req.model, gpu, batch=batch, **kw)["tpot_s"])
    kw = {"dtype": req.dtype, "tensor_parallel": tp}
    return (ttft_s(req.model, gpu, req.input_tokens, logits="last", **kw) / efficiency,
            decode_time_per_token_s(req.model, gpu, batch, req.context_tokens, **kw) / efficiency)


def _replica(req: ServiceRequirements, gpu: str, tp: int, reserve_fraction: float,
             efficiency: float | None) -> dict | None:
    """One replica of ``tp`` GPUs: what fits and how fast (None if the weights do not fit).

    The batch it runs at the peak and its speed depend on each other: requests stay
    ``TTFT + output_tokens · TPOT`` seconds, so the requests in flight (Little's law) set the
    batch, and the batch sets TPOT. Starting from a batch of 1 this fixed point is reached in a
    few rounds (TPOT grows with the batch, so the batch only grows; capped by the KV budget)."""
    budget = kv_budget(req.model, gpu, req.dtype, context=req.context_tokens,
                       reserve_fraction=reserve_fraction, num_gpus=tp)
    if budget.max_sequences < 1:
        return None
    batch, seen = 1, set()
    while batch not in seen:
        seen.add(batch)
        ttft, tpot = _latency(req, gpu, tp, batch, efficiency)
        in_flight = traffic(req, ttft_s=ttft, tpot_s=tpot).peak_concurrency
        batch = min(budget.max_sequences, in_flight)
    ttft, tpot = _latency(req, gpu, tp, batch, efficiency)
    return {"tp": tp, "budget": budget, "batch": batch, "tpot": tpot, "ttft": ttft,
            "in_flight": traffic(req, ttft_s=ttft, tpot_s=tpot).peak_concurrency,
            "tokens_per_s": batch / tpot}


def _check_inputs(req, prices, efficiency) -> None:
    """``ValueError`` naming the argument that is not a requirement, a price list or a share
    (``None``: the fitted efficiencies)."""
    if not isinstance(req, ServiceRequirements):
        raise ValueError(f"req must be a ServiceRequirements, got {type(req).__name__}")
    if not isinstance(prices, PlanPrices):
        raise ValueError(f"prices must be a PlanPrices, got {type(prices).__name__}")
    if efficiency is not None and (isinstance(efficiency, bool)
                                   or not isinstance(efficiency, (int, float))
                                   or not 0 < efficiency <= 1):
        raise ValueError(f"efficiency must be None (the fitted efficiencies) or in (0, 1], "
                         f"got {efficiency!r}")


def _layouts(req: ServiceRequirements, gpu: str, t, reserve_fraction: float,
             efficiency: float | None) -> list[dict]:
    """Every tensor-parallel size of :data:`TP_SIZES` whose replica holds the model, with its
    replicas (enough for the requests in flight and the peak tokens/s), GPUs and whether its
    TTFT and TPOT meet the targets; ``ValueError`` where none holds it."""
    options = [r for tp in TP_SIZES if (r := _replica(req, gpu, tp, reserve_fraction,
                                                      efficiency))]
    if not options:
        raise ValueError(f"{req.model} in {req.dtype} with {req.context_tokens}-token requests "
                         f"does not fit on up to {TP_SIZES[-1]} × {gpu}")
    for r in options:
        r["replicas"] = max(math.ceil(r["in_flight"] / r["batch"]),
                            math.ceil(t.peak_output_tokens_per_s / r["tokens_per_s"]))
        r["gpus"] = r["replicas"] * r["tp"]
        r["meets"] = r["ttft"] <= req.ttft_target_s and r["tpot"] <= req.tpot_target_s
    return options


def plan_deployment(req: ServiceRequirements, gpu: str, prices: PlanPrices,
                    reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
                    efficiency: float | None = None) -> Plan:
    """The cheapest layout on ``gpu`` that meets ``req`` at its peak, and how it compares with
    the API.

    For each tensor-parallel size in :data:`TP_SIZES`: the requests in flight at the peak
    (Little's law with the layout's own TTFT and TPOT) give the batch, capped by what the
    replica's KV budget holds; :func:`~llminfra.planning.predict.predict_latency` gives its TTFT
    (one prompt's prefill on an idle replica) and time per output token at that batch: the
    roofline bounds through efficiencies fitted to AIConfigurator's estimates for vLLM. An
    explicit ``efficiency`` (a share in (0, 1], e.g. one you measured) divides the bounds
    instead (TTFT: the output layer once, ``logits="last"``; TPOT at the full context), as the
    planner did before the fit; replicas = max(ceil(in flight / batch),
    ceil(peak output tokens/s / replica tokens/s)). Layouts whose TTFT or TPOT miss the
    targets are dropped; the one with the fewest GPUs wins (ties: the smaller tensor-parallel
    size). Raises ``ValueError`` if no layout of up to 8 GPUs per replica holds the model.
    """
    _check_inputs(req, prices, efficiency)
    g = get_gpu(gpu)
    t = traffic(req)
    options = _layouts(req, g.name, t, reserve_fraction, efficiency)
    meeting = [r for r in options if r["meets"]]
    best = min(meeting or options, key=lambda r: (r["gpus"], r["tp"]))
    capacity = best["replicas"] * best["tokens_per_s"]
    utilization = min(1.0, t.mean_output_tokens_per_s / capacity)
    api = cost_model.api_monthly_cost(req.requests_per_day, req.input_tokens, req.output_tokens,
                                      prices.api_input_per_million, prices.api_output_per_million)
    gpu_hour = prices.gpu_hour(g.name)
    rented = cost_model.gpu_rental_monthly_cost(gpu_hour, best["gpus"])
    monthly_tokens = api.monthly_input_tokens + api.monthly_output_tokens
    plan = dict(
        gpu=g.name, tensor_parallel=best["tp"], replicas=best["replicas"],
        total_gpus=best["gpus"], fits=True,
        max_sequences_per_replica=best["budget"].max_sequences,
        peak_concurrency=best["in_flight"], batch_per_replica=best["batch"],
        ttft_estimate_s=best["ttft"], tpot_estimate_s=best["tpot"],
        replica_tokens_per_s=best["tokens_per_s"],
        peak_output_tokens_per_s=t.peak_output_tokens_per_s, utilization=utilization,
        gpu_hour_usd=gpu_hour, selfhost_monthly_usd=rented, api_monthly_usd=api.monthly_cost,
        selfhost_usd_per_million=rented / monthly_tokens * 1e6,
        api_usd_per_million=api.monthly_cost / monthly_tokens * 1e6)
    rec, reasons = _recommend(req, plan, bool(meeting))
    cost = plan["api_monthly_usd"] if rec == "hosted API" else plan["selfhost_monthly_usd"]
    budget_usd = float(req.budget_usd_per_month)
    reasons.append(f"the recommendation costs {cost:,.0f} USD a month: "
                   + (f"within the budget of {budget_usd:,.0f} USD" if cost <= budget_usd else
                      f"{cost - budget_usd:,.0f} USD over the budget of {budget_usd:,.0f} USD"))
    plan.update(recommendation=rec, reasons=tuple(reasons), budget_usd_per_month=budget_usd,
                recommended_monthly_usd=cost)
    plan["checklist"] = tuple(checklist(req, plan, best["budget"]))
    return Plan(**plan)


def _recommend(req: ServiceRequirements, p: dict, meets: bool) -> tuple[str, list[str]]:
    reasons = []
    if not meets:
        reasons.append(f"no layout on {p['gpu']} meets TTFT ≤ {req.ttft_target_s:g} s and TPOT ≤ "
                       f"{req.tpot_target_s:g} s; the closest is shown")
    if not req.data_may_leave:
        reasons.append("prompts may not leave the company: a hosted API is excluded")
        return "self-host (rented GPUs or own servers)", reasons
    cheaper = "self-host" if p["selfhost_monthly_usd"] < p["api_monthly_usd"] else "hosted API"
    reasons.append(f"at this volume the API costs {p['api_monthly_usd']:,.0f} USD a month and "
                   f"{p['total_gpus']} rented {p['gpu']} cost {p['selfhost_monthly_usd']:,.0f} USD "
                   f"(utilisation {p['utilization']:.0%})")
    return cheaper, reasons


def _ms(seconds: float) -> str:
    """Milliseconds as a person writes them: 3 significant digits below 1,000 (49.9), whole
    and grouped from there (12,340), never an exponent."""
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:,.0f}"


def checklist(req: ServiceRequirements, p: dict, budget) -> list[dict]:
    """Source 000's pre-deployment checklist, evaluated for this plan: one row per check with
    ``group`` (memory / performance / cost and operations), ``check``, ``ok`` (True, False, or
    None where only a measurement or a person can tell) and ``number`` (what the tick rests on)."""
    quantized = req.dtype not in ("fp32", "bf16", "fp16")
    rows = [
        ("memory", "weights counted at the precision's bytes", True,
         f"{budget.weight_bytes / 1e9:.4g} GB in {req.dtype}"),
        ("memory", "room left for the KV cache at the peak", p["max_sequences_per_replica"]
         * p["replicas"] >= p["peak_concurrency"],
         f"{p['max_sequences_per_replica']} × {p['replicas']} sequences for {p['peak_concurrency']} "
         f"in flight"),
        ("memory", "quality evaluated after quantization", None if quantized else True,
         "run your own evaluation set" if quantized else "not quantized"),
        ("performance", "TTFT target set and met (estimate)", p["ttft_estimate_s"] <= req.ttft_target_s,
         f"{_ms(p['ttft_estimate_s'])} ms vs {req.ttft_target_s:g} s"),
        ("performance", "time per output token met (estimate)", p["tpot_estimate_s"] <= req.tpot_target_s,
         f"{_ms(p['tpot_estimate_s'])} ms vs {req.tpot_target_s * 1e3:g} ms"),
        ("performance", "throughput measured under real load", None,
         "run a load test (chapter 05's loadtest) before going live"),
        ("performance", "an engine with continuous batching", True, "assumed by the plan"),
        ("cost and operations", "input and output tokens priced apart", True,
         f"{req.input_tokens} in, {req.output_tokens} out per request"),
        ("cost and operations", "GPU utilisation watched (≥ 30 %)", p["utilization"] >= 0.30,
         f"{p['utilization']:.0%} of peak capacity on average"),
        ("cost and operations", "data policy respected", True,
         "API allowed" if req.data_may_leave else "self-hosting only"),
    ]
    return [{"group": g, "check": c, "ok": ok, "number": n} for g, c, ok, n in rows]


def _row(p: Plan) -> dict:
    return {"gpu": p.gpu, "fits": True, "tensor_parallel": p.tensor_parallel,
            "replicas": p.replicas, "total_gpus": p.total_gpus,
            "ttft_ms": p.ttft_estimate_s * 1e3, "tpot_ms": p.tpot_estimate_s * 1e3,
            "utilization": p.utilization, "gpu_hour_usd": p.gpu_hour_usd,
            "selfhost_usd_per_month": p.selfhost_monthly_usd, "api_usd_per_month": p.api_monthly_usd}


def compare_gpus(req: ServiceRequirements, gpus, prices: PlanPrices,
                 efficiency: float | None = None) -> list[dict]:
    """:func:`plan_deployment` on each GPU of ``gpus``: one row per GPU with the layout, the
    estimates, the GPU-hour price and the monthly cost; GPUs the model does not fit on get
    ``fits=False``, GPUs without a price a NaN cost and a ``note`` saying so."""
    rows = []
    for name in gpus:
        try:
            rows.append(_row(plan_deployment(req, name, prices, efficiency=efficiency)))
        except ValueError as e:
            rows.append({"gpu": name, "fits": False, "note": str(e)})
        except KeyError as e:                               # it fits, but has no price
            layout = plan_deployment(req, name, dataclasses.replace(prices, gpu_hour_usd=0.0),
                                     efficiency=efficiency)
            rows.append({**_row(layout), "gpu_hour_usd": math.nan,
                         "selfhost_usd_per_month": math.nan, "note": e.args[0]})
    return rows


__all__ = ["EXAMPLE_GPU_HOUR_USD", "EXAMPLE_GPU_HOUR_LABEL", "Plan", "PlanPrices", "checklist", "compare_gpus", "plan_deployment"]
