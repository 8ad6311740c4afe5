"""Fit :mod:`llminfra.planning.predict`'s efficiencies to the AIConfigurator record
(``compare_planner.json``), on part of its points, and check them on the rest.

Per GPU of the record, the parameters of :func:`~llminfra.planning.predict.predict_latency`:
``e_prefill`` at :data:`PREFILL_TOKEN_KNOTS` and ``e_decode`` at :data:`DECODE_BATCH_KNOTS` (linear
in ``log x`` between them), for dense and mixture-of-experts models and each tensor-parallel size
apart, and for each phase and tensor-parallel size above 1 the link's share of bandwidth ``β`` at
each all-reduce size of :data:`~llminfra.planning.predict.ALLREDUCE_KNOTS` and the latency per ring
step ``α``. They minimise the squared log error of TTFT and TPOT against AIConfigurator's on the
training points, by gradient descent (Adam) on unconstrained variables: ``e = sigmoid(u)`` and ``β =
sigmoid(v)`` stay in (0, 1); a dense model's decode ``e`` at each batch knot is the one before times
a sigmoid (it never rises with the batch, so its TPOT never falls as the batch grows, the bound's KV
reads growing), while a mixture of experts' may rise (its bound reads more experts as the batch
grows, and AIConfigurator finds its small batches' expert kernels far from that bound); ``β`` has a
sigmoid of its own at each size knot, not a monotone curve (AIConfigurator's all-reduces are not: on
eight L40S over PCIe a decode all-reduce of a million values reaches more of the link than one of
two million), with a small penalty on the squared logit difference of neighbouring knots
(:data:`SIZE_SMOOTHING`) that holds a knot no point reaches at its neighbours' value; it is stored
as the best knot's share times a factor in (0, 1] per knot; ``α = softplus(w)`` µs stays >= 0. The
all-reduce time is ``a / β + b · α`` with ``a`` and ``b`` the point's all-reduce time at full
bandwidth and its ring steps' count (:func:`~llminfra.planning.predict.step_parts`) and ``β`` read
at its all-reduces' size, so a point's features are computed once.

Held back from the fit (:func:`held_back`): every point of chapter 10's scenarios (their
prompt lengths are not on the grid) and a quarter of the grid, drawn with a fixed seed, each
model / GPU / tensor-parallel size / batch keeping one of its lengths in the fit: the check is
of lengths and scenarios the fit did not see, not of a batch it never saw (drawn freely, a
cell held back whole can miss far more, as Qwen3-30B-A3B's decode on two L40S at batch 1 did,
where AIConfigurator's mixture-of-experts curve is not monotone in the batch). The
errors on them, and those of the one 50 % the planner used before, go into the output. Taught
in chapter 10.
"""

from __future__ import annotations

import random
import statistics

import torch

from llminfra.calc.roofline import decode_batch, prefill_batch
from llminfra.planning.predict import (ALLREDUCE_KNOTS, ARCHITECTURES, allreduce_values,
                                       architecture, interpolate, predict_latency, step_parts)

PREFILL_TOKEN_KNOTS = (256, 1024, 4096, 16384, 65536, 262144)
DECODE_BATCH_KNOTS = (1, 4, 16, 64, 128)
HELD_BACK_SHARE, SEED = 0.25, 0
#: weight of the squared logit difference between neighbouring all-reduce size knots
SIZE_SMOOTHING = 1e-4
#: the planner's efficiency before this fit: one share for TTFT and TPOT alike
FLAT_EFFICIENCY = 0.5


def held_back(points: list[dict]) -> list[bool]:
    """Which points the fit does not see: the scenarios', and each grid point with probability
    :data:`HELD_BACK_SHARE` (``random.Random(SEED)``, in the record's order), except that every
    model / GPU / tensor-parallel size / batch keeps one of its lengths in the fit: the check
    is on lengths and scenarios the fit did not see, between batches and sizes it did."""
    draw, fitted_cells, out = random.Random(SEED), set(), []
    cells = [(p["model"], p["gpu"], p["tp"], p["batch"]) for p in points]
    last = {cell: i for i, cell in enumerate(cells)}
    for i, (p, cell) in enumerate(zip(points, cells)):
        hold = p["scenario"] != "grid" or draw.random() < HELD_BACK_SHARE
        if p["scenario"] == "grid" and hold and last[cell] == i and cell not in fitted_cells:
            hold = False                   # the cell's last length, and none of it fitted yet
        if p["scenario"] == "grid" and not hold:
            fitted_cells.add(cell)
        out.append(hold)
    return out


def features(p: dict) -> dict:
    """A point's roofline parts (seconds): ``(t_roof, a, b, n)`` for the prefill and the
    decode, ``a`` the all-reduces at full bandwidth, ``b`` their time per second of latency a
    step, ``n`` the values one all-reduce sums (:func:`~.predict.allreduce_values`)."""
    kw = {"tensor_parallel": p["tp"], "dtype": p["dtype"]}
    out = {}
    for phase, pairs, logits, tokens in (
            ("prefill", prefill_batch(p["isl"], p["batch"]), "last", p["batch"] * p["isl"]),
            ("decode", decode_batch(p["batch"], p["isl"] + p["osl"] // 2), "every",
             p["batch"])):
        roof, a = step_parts(p["model"], p["gpu"], pairs, logits=logits, **kw)
        _, a_plus = step_parts(p["model"], p["gpu"], pairs, logits=logits, link_latency_s=1e-6,
                               **kw)
        out[phase] = (roof, a, (a_plus - a) / 1e-6, allreduce_values(p["model"], tokens))
    return out


def _weights(knots, xs) -> torch.Tensor:
    """``(points, knots)``: each point's interpolation weights over ``knots``."""
    eye = torch.eye(len(knots), dtype=torch.float64)
    return torch.stack([torch.tensor([interpolate(list(knots), row.tolist(), x) for row in eye],
                                     dtype=torch.float64) for x in xs])


def _falling(u: torch.Tensor) -> torch.Tensor:
    """Shares in (0, 1) that never rise along the last axis: cumulative products of sigmoids."""
    return torch.cumprod(torch.sigmoid(u), dim=-1)


class _Variables:
    """The unconstrained variables of one GPU and the parameters they give: efficiency tables
    ``(architectures, tensor-parallel sizes, knots)`` per phase (a tensor-parallel size shifts
    the first size's curve in logit space: it stays in (0, 1), a falling one falls), the link's
    share ``β`` per phase (a prefill's all-reduces are large, a decode step's small: NCCL sends
    them differently), size and all-reduce size knot, its latency ``α`` per phase and size."""

    def __init__(self, kinds: list[str], tps: list[int]):
        f64 = torch.float64
        self.dense = torch.tensor([k == "dense" for k in kinds])[:, None]
        self.u_pre = torch.zeros(len(kinds), len(PREFILL_TOKEN_KNOTS), dtype=f64,
                                 requires_grad=True)
        u_dec = torch.where(self.dense, 4.0, 0.0) * torch.ones(len(DECODE_BATCH_KNOTS),
                                                               dtype=f64)
        u_dec[:, 0] = 0.0
        self.u_dec = u_dec.requires_grad_(True)
        self.shift = torch.zeros(len(kinds), 2, len(tps), dtype=f64, requires_grad=True)
        self.first = torch.tensor([tp == 1 for tp in tps])
        self.v = torch.zeros(2, len(tps), len(ALLREDUCE_KNOTS), dtype=f64,
                             requires_grad=True)                     # (phase, size, knot)
        self.w = torch.zeros(2, len(tps), dtype=f64, requires_grad=True)

    def parameters(self) -> list[torch.Tensor]:
        return [self.u_pre, self.u_dec, self.shift, self.v, self.w]

    def roughness(self) -> torch.Tensor:
        """The squared logit differences of neighbouring all-reduce size knots."""
        return (self.v.diff(dim=-1) ** 2).sum()

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        base_dec = torch.where(self.dense, _falling(self.u_dec), torch.sigmoid(self.u_dec))
        shift = torch.where(self.first, 0.0, self.shift)
        return tuple(torch.sigmoid(torch.logit(base)[:, None, :] + shift[:, i, :, None])
                     for i, base in enumerate((torch.sigmoid(self.u_pre), base_dec)))

    def link(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``β`` per (phase, size, all-reduce size knot) and ``α`` per (phase, size)."""
        return torch.sigmoid(self.v), torch.nn.functional.softplus(self.w) * 1e-6


def _fit_gpu(rows: list[dict], tps: list[int], steps: int = 3000) -> dict:
    """The parameters of one GPU fitted to its training ``rows`` (with their features): the
    efficiencies per architecture (:func:`~llminfra.planning.predict.architecture`) and
    tensor-parallel size, the link's per tensor-parallel size."""
    f64 = torch.float64
    kinds = sorted({architecture(r["model"]) for r in rows})
    kind_of = torch.tensor([kinds.index(architecture(r["model"])) for r in rows])
    tp_of = torch.tensor([tps.index(r["tp"]) for r in rows])
    w_pre = _weights(PREFILL_TOKEN_KNOTS, [r["batch"] * r["isl"] for r in rows])
    w_dec = _weights(DECODE_BATCH_KNOTS, [r["batch"] for r in rows])
    col = {k: torch.tensor([[r["f"][ph][i] for ph in ("prefill", "decode")] for r in rows],
                           dtype=f64) for i, k in enumerate(("roof", "a", "b"))}
    w_size = torch.stack([_weights(ALLREDUCE_KNOTS, [r["f"][ph][3] for r in rows])
                          for ph in ("prefill", "decode")])          # (phase, points, knots)
    target = torch.tensor([[r["aic_ttft_ms"] / 1e3, r["aic_tpot_ms"] / 1e3] for r in rows],
                          dtype=f64)
    x = _Variables(kinds, tps)
    opt = torch.optim.Adam(x.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        pre, dec = x.tables()
        e = torch.stack([(w_pre * pre[kind_of, tp_of]).sum(1),
                         (w_dec * dec[kind_of, tp_of]).sum(1)], dim=1)
        share, latency = x.link()
        beta = (w_size * share[:, tp_of]).sum(-1).T
        alpha = latency[:, tp_of].T
        loss = (torch.log((col["roof"] / e + col["a"] / beta + col["b"] * alpha)
                          / target) ** 2).mean() + SIZE_SMOOTHING * x.roughness()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pre, dec = x.tables()
        by_size, alpha = x.link()
        beta = by_size.max(dim=-1).values
        factor = by_size / beta[..., None]
        out = {kind: {"prefill": {"tokens": list(PREFILL_TOKEN_KNOTS), "efficiency": {
                          str(tp): pre[k, i].tolist() for i, tp in enumerate(tps)}},
                      "decode": {"batch": list(DECODE_BATCH_KNOTS), "efficiency": {
                          str(tp): dec[k, i].tolist() for i, tp in enumerate(tps)}},
                      "fitted_on_points": int((kind_of == k).sum())}
               for k, kind in enumerate(kinds)}
        many = [(i, str(tp)) for i, tp in enumerate(tps) if tp > 1]
        return {**out, **{name: {ph: {tp: float(t[j, i]) for i, tp in many}
                                 for j, ph in enumerate(("prefill", "decode"))}
                          for name, t in (("link_bandwidth_share", beta),
                                          ("link_latency_s", alpha))},
                "link_size_factor": {"values": list(ALLREDUCE_KNOTS), **{
                    ph: {tp: factor[j, i].tolist() for i, tp in many}
                    for j, ph in enumerate(("prefill", "decode"))}}}


def _median_parameters(per_gpu: list[dict]) -> dict:
    """The element-wise median of fitted GPUs' parameters: for GPUs outside the fit."""
    med = statistics.median
    out = {}
    for kind in ARCHITECTURES:
        have = [g[kind] for g in per_gpu if kind in g]
        out[kind] = {ph: {key: have[0][ph][key], "efficiency": {
                         tp: [med(g[ph]["efficiency"][tp][i] for g in have)
                              for i in range(len(curve))]
                         for tp, curve in have[0][ph]["efficiency"].items()}}
                     for ph, key in (("prefill", "tokens"), ("decode", "batch"))}
    for name in ("link_bandwidth_share", "link_latency_s"):
        out[name] = {ph: {tp: med(g[name][ph][tp] for g in per_gpu)
                          for tp in per_gpu[0][name][ph]} for ph in ("prefill", "decode")}
    factors = [g["link_size_factor"] for g in per_gpu]
    out["link_size_factor"] = {"values": factors[0]["values"], **{
        ph: {tp: [med(f[ph][tp][i] for f in factors) for i in range(len(curve))]
             for tp, curve in factors[0][ph].items()} for ph in ("prefill", "decode")}}
    return out


def errors(ratios: list[float]) -> dict:
    """``min``, ``median``, ``max`` of predicted / AIConfigurator, and how many are within
    ±25 %."""
    return {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
            "within_25_percent": sum(0.75 <= r <= 1.25 for r in ratios), "points": len(ratios)}


def check(table: dict, points: list[dict]) -> dict:
    """Predicted / AIConfigurator's TTFT and TPOT on ``points``: with ``table``
    (:func:`~llminfra.planning.predict.predict_latency`) and with the flat 50 %."""
    from_table, flat = {"ttft": [], "tpot": []}, {"ttft": [], "tpot": []}
    for p in points:
        got = predict_latency(p["model"], p["gpu"], tensor_parallel=p["tp"], batch=p["batch"],
                              input_tokens=p["isl"], output_tokens=p["osl"], dtype=p["dtype"],
                              efficiencies=table)
        for key in ("ttft", "tpot"):
            aic = p[f"aic_{key}_ms"] / 1e3
            from_table[key].append(got[f"{key}_s"] / aic)
            flat[key].append(p[f"bound_{key}_ms"] / 1e3 / FLAT_EFFICIENCY / aic)
    return {"fitted": {k: errors(v) for k, v in from_table.items()},
            "flat_50_percent": {k: errors(v) for k, v in flat.items()}}


def fit(record: dict, source: str = "llminfra/data/compare_planner.json") -> dict:
    """The efficiency table (``planner_efficiency.json``) fitted to ``record``'s training
    points, with its errors on the held-back ones."""
    estimated = [p for p in record["points"] if "aic_error" not in p]
    hold = held_back(estimated)
    train = [{**p, "f": features(p)} for p, h in zip(estimated, hold) if not h]
    tps = sorted({p["tp"] for p in estimated})
    gpus = {gpu: _fit_gpu([r for r in train if r["gpu"] == gpu], tps)
            for gpu in sorted({p["gpu"] for p in estimated})}
    env = record["environment"]
    table = {
        "what": ("efficiencies FITTED (llminfra.planning.efficiency_fit) to AIConfigurator's "
                 "static estimates for vLLM in " + source + ", not measured on an engine: per "
                 "GPU and architecture (dense, moe) the share e of the roofline's "
                 "arithmetic-or-memory time reached in prefill (by tokens a prefill multiplies, "
                 "batch x input tokens) and in decode (by batch), and per tensor-parallel size "
                 "the link's share of bandwidth (link_bandwidth_share: the best all-reduce "
                 "size's, times link_size_factor by the values one all-reduce sums, tokens x "
                 "hidden size) and latency per ring step; fallback: the median over the fitted "
                 "GPUs, for GPUs outside the fit (an extrapolation)"),
        "fitted_to": {"record": source, "record_date": env["date"],
                      "aiconfigurator": env["aiconfigurator"], "backend": env["backend"],
                      "database_versions_by_system": env["database_versions_by_system"]},
        "fitted_on": {"points": len(train), "rule": (
            "every estimated point except the held-back ones: all of chapter 10's scenario "
            f"points and {HELD_BACK_SHARE:.0%} of the grid (random.Random({SEED}) in the "
            "record's order); squared log error of TTFT and TPOT, Adam")},
        "cpu": {"source": "llminfra/data/compare_engines_cpu.json", "note": (
            "measured, not fitted: the CPU engines' TTFT and TPOT efficiencies against this "
            "CPU's roofline, which chapter 10 shows beside these")},
        "tensor_parallel_sizes": tps, "gpus": gpus,
        "fallback": _median_parameters(list(gpus.values())),
    }
    held = [p for p, h in zip(estimated, hold) if h]
    table["held_back"] = [{k: p[k] for k in ("scenario", "model", "dtype", "gpu", "tp", "batch",
                                             "isl", "osl")} for p in held]
    table["held_back_errors"] = check(table, held)
    return table
