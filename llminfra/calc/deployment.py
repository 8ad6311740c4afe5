"""The four ways to deploy an LLM, compared, and a decision helper that ranks them.

The four (source 000, "choosing a deployment"; source 004, "cloud vs on-premises"):

* ``api``: a provider's hosted API, paid per token;
* ``rented``: GPUs rented by the hour from a cloud, running your own inference engine;
* ``own``: servers you buy, power and operate (on-premises);
* ``local``: a small or quantized model on a PC or laptop, for one person.

:func:`deployment_options` is the qualitative table; :func:`rank_deployments` turns
requirements (volume, whether data may leave, whether an open-weights model is needed, whether
there is a team to run GPUs, how steady the load is) and prices (always inputs) into a ranking
with a reason for every step. Monthly costs come from :mod:`llminfra.calc.cost`, so the numbers
match chapter 09's cells. Taught in chapter 09.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llminfra.calc.cost import (DAYS_PER_MONTH, HOURS_PER_DAY, _check, _check_utilization,
                                gpu_rental_monthly_cost)
from llminfra.validate import positive_int

OPTIONS = ("api", "rented", "own", "local")


def deployment_options() -> list[dict]:
    """The four options side by side (a new list of new dicts on each call).

    Columns: how you pay, who operates it, where the data goes, which models you can run,
    and when it tends to win. The qualitative content follows source 000 (its four options)
    and source 004 (cloud: little up-front cost, elastic; on-premises: data sovereignty,
    control, cheaper only over a long, busy life).
    """
    return [
        {"option": "api", "name": "hosted API",
         "cost": "per token (input and output priced apart); nothing when idle",
         "operations": "none: the provider runs the GPUs",
         "data_residency": "prompts and outputs leave for the provider",
         "model_choice": "the provider's catalog only",
         "wins_when": "low or spiky volume, no GPU team"},
        {"option": "rented", "name": "rented cloud GPUs",
         "cost": "per GPU hour, busy or idle; no purchase",
         "operations": "you run the inference engine, scaling and monitoring",
         "data_residency": "in your cloud account (the cloud's region and terms)",
         "model_choice": "any open-weights model that fits the GPUs",
         "wins_when": "steady volume, need an open or fine-tuned model, no capital to spend"},
        {"option": "own", "name": "own servers (on-premises)",
         "cost": "purchase amortised + power (TDP x PUE x price) + staff, busy or idle",
         "operations": "you run everything, down to power, cooling and spare parts",
         "data_residency": "stays in your building",
         "model_choice": "any open-weights model that fits the GPUs",
         "wins_when": "high, steady volume for years; data must stay inside"},
        {"option": "local", "name": "local (PC or laptop)",
         "cost": "hardware you already have; electricity",
         "operations": "one person's machine",
         "data_residency": "stays on the machine",
         "model_choice": "small or quantized open models that fit its memory",
         "wins_when": "one user, trying things out, offline"},
    ]


@dataclass(frozen=True)
class Requirements:
    """What the service needs. ``monthly_tokens`` counts input + output tokens.

    ``utilization``: the share of the GPUs' capacity the load would keep busy on average
    (steady load: high; spiky or office-hours load: low), in (0, 1].
    """

    monthly_tokens: float
    data_may_leave: bool = True
    needs_open_weights: bool = False
    has_gpu_team: bool = False
    single_user: bool = False
    utilization: float = 0.5

    def __post_init__(self):
        _check("monthly_tokens", self.monthly_tokens)
        _check_utilization(self.utilization)


@dataclass(frozen=True)
class Prices:
    """The prices the ranking uses; all inputs (examples in chapter 09 carry date and source).

    ``api_usd_per_million``: blended API price (see ``blended_price_per_million``);
    ``rent_usd_per_gpu_hour``; ``own_usd_per_gpu_hour``: owning cost per GPU hour
    (``own_server_monthly_cost(...).gpu_hour_cost``); ``tokens_per_s_per_gpu``: the throughput
    one GPU sustains when busy (measured, or a roofline bound); ``gpus_per_replica``: GPUs one
    copy of the model needs.
    """

    api_usd_per_million: float
    rent_usd_per_gpu_hour: float
    own_usd_per_gpu_hour: float
    tokens_per_s_per_gpu: float
    gpus_per_replica: int = 1

    def __post_init__(self):
        _check("api_usd_per_million", self.api_usd_per_million)
        _check("rent_usd_per_gpu_hour", self.rent_usd_per_gpu_hour)
        _check("own_usd_per_gpu_hour", self.own_usd_per_gpu_hour)
        _check("tokens_per_s_per_gpu", self.tokens_per_s_per_gpu, positive=True)
        positive_int("gpus_per_replica", self.gpus_per_replica)


@dataclass(frozen=True)
class RankedOption:
    """One option as ranked: feasible or not, its monthly cost (USD, ``None`` where there is
    no per-month figure), the GPUs it needs, and the reasons, in the order they were found."""

    option: str
    feasible: bool
    monthly_cost_usd: float | None
    n_gpus: int
    reasons: list[str] = field(default_factory=list)


def millions(tokens: float) -> str:
    """Tokens in millions as people write them: grouped digits from 1,000 M up (``43,020``,
    never ``4.302e+04``), four significant digits below (``2.25``)."""
    m = tokens / 1e6
    return f"{m:,.0f}" if m >= 1000 else f"{m:.4g}"


def gpus_needed(monthly_tokens, tokens_per_s_per_gpu, utilization, gpus_per_replica=1,
                days=DAYS_PER_MONTH) -> int:
    """GPUs to serve ``monthly_tokens`` when each, busy a share ``u`` of the month, serves
    ``T`` tokens/s: ``ceil(V / (T · u · 3600 · 24 · days) / g) · g`` (whole replicas of ``g``
    GPUs, at least one replica). 1e9 tokens at 1,000 tokens/s and u = 0.5: one GPU serves
    1.296e9, so 1 GPU.
    """
    v = _check("monthly_tokens", monthly_tokens)
    t = _check("tokens_per_s_per_gpu", tokens_per_s_per_gpu, positive=True)
    u = _check_utilization(utilization)
    per_gpu = t * u * 3600 * HOURS_PER_DAY * days
    replicas = max(1, math.ceil(v / (per_gpu * gpus_per_replica)))
    return replicas * gpus_per_replica


def rank_deployments(req: Requirements, prices: Prices) -> list[RankedOption]:
    """Rank the four options: feasible ones first, cheapest first; ties go to less operations
    (api, rented, own, local order). Rules, each giving a reason:

    * data may not leave → ``api`` infeasible;
    * an open-weights (or own fine-tuned) model is needed → ``api`` infeasible;
    * ``local`` is feasible only for a single user (its cost is taken as 0 USD a month: the
      machine exists already);
    * no GPU team → ``rented`` and ``own`` stay feasible but are ranked after any feasible
      option that needs no team (a reason says so);
    * costs: api = tokens · price; rented / own = GPUs needed (:func:`gpus_needed`) · price per
      GPU hour · 24 · 30 (GPU hours are paid busy or idle).
    """
    if not isinstance(req, Requirements):
        raise ValueError(f"req must be a Requirements, got {type(req).__name__}")
    if not isinstance(prices, Prices):
        raise ValueError(f"prices must be a Prices, got {type(prices).__name__}")
    n = gpus_needed(req.monthly_tokens, prices.tokens_per_s_per_gpu, req.utilization,
                    prices.gpus_per_replica)
    out = []
    api = RankedOption("api", True, req.monthly_tokens / 1e6 * prices.api_usd_per_million, 0,
                       [f"{millions(req.monthly_tokens)} M tokens x "
                        f"{prices.api_usd_per_million:.4g} USD per M"])
    if not req.data_may_leave:
        api = RankedOption("api", False, api.monthly_cost_usd, 0,
                           api.reasons + ["data may not leave: a hosted API sends it out"])
    if req.needs_open_weights:
        api = RankedOption("api", False, api.monthly_cost_usd, 0,
                           api.reasons + ["needs an open-weights model: an API serves only "
                                          "the provider's catalog"])
    out.append(api)
    for option, price in (("rented", prices.rent_usd_per_gpu_hour),
                          ("own", prices.own_usd_per_gpu_hour)):
        reasons = [f"{n:,} GPU(s) at {price:.4g} USD per GPU hour, paid busy or idle "
                   f"(load keeps them {req.utilization:.0%} busy)"]
        if not req.has_gpu_team:
            reasons.append("no team to run GPUs: ranked after options that need none")
        out.append(RankedOption(option, True, gpu_rental_monthly_cost(price, n), n, reasons))
    local = RankedOption("local", req.single_user, 0.0 if req.single_user else None, 0,
                         ["one user on hardware already owned"] if req.single_user else
                         ["serves one person only; this service has more users"])
    out.append(local)

    def key(r: RankedOption):
        needs_team = r.option in ("rented", "own") and not req.has_gpu_team
        return (not r.feasible, needs_team, r.monthly_cost_usd if r.monthly_cost_usd is not None
                else math.inf, OPTIONS.index(r.option))
    return sorted(out, key=key)


def monthly_cost_curves(monthly_tokens, prices: Prices, utilization) -> dict[str, list[float]]:
    """Monthly cost (USD) of ``api``, ``rented`` and ``own`` at each volume in
    ``monthly_tokens``: the API grows in proportion, self-hosting in steps of whole replicas
    (:func:`gpus_needed`). 75e6 and 5e9 tokens at the test prices (5.4 USD per M; 2 and 1.2 USD
    per GPU hour; 1,000 tokens/s; u = 0.8): api 405 and 27,000; rented 1,440 and 4,320."""
    if not isinstance(prices, Prices):
        raise ValueError(f"prices must be a Prices, got {type(prices).__name__}")
    curves = {"api": [], "rented": [], "own": []}
    for v in monthly_tokens:
        n = gpus_needed(v, prices.tokens_per_s_per_gpu, utilization, prices.gpus_per_replica)
        curves["api"].append(_check("monthly_tokens", v) / 1e6 * prices.api_usd_per_million)
        curves["rented"].append(gpu_rental_monthly_cost(prices.rent_usd_per_gpu_hour, n))
        curves["own"].append(gpu_rental_monthly_cost(prices.own_usd_per_gpu_hour, n))
    return curves
