"""Chapter 10's requirements form, driven from Python: changing an input changes the plan."""

from llminfra.planning import PlanPrices, ServiceRequirements, plan_deployment
from llminfra.widgets.plan_form import PlanForm, plan_html


def test_form_shows_the_plan_and_follows_inputs():
    req = ServiceRequirements(100_000, 1000, 500)
    f = PlanForm(req, "h100", PlanPrices(3, 15, 3))
    expected = plan_deployment(req, "h100", PlanPrices(3, 15, 3, "example prices entered in the form"))
    assert f.plan == expected
    assert f.summary.value.startswith(expected.recommendation)
    assert "✓" in f.html.value and "<table>" in f.html.value
    f.may_leave.value = False
    assert f.plan.recommendation.startswith("self-host")
    f.model.value = "llama-2-70b"
    assert f.plan.tensor_parallel >= 2                   # 138 GB of weights need 2+ H100s
    assert f"{f.plan.total_gpus} × h100" in f.summary.value
    before = f.plan.total_gpus
    f.requests.value = 2_000_000
    assert f.plan.total_gpus >= before


def test_form_reports_invalid_input_without_raising():
    f = PlanForm(ServiceRequirements(1000, 100, 100))
    f.output_tokens.value = 0
    assert f.plan is None and f.summary.value.startswith("cannot plan: output_tokens")
    f.output_tokens.value = 50
    assert f.plan is not None


def test_plan_html_escapes_and_marks():
    p = plan_deployment(ServiceRequirements(100, 100, 100, data_may_leave=False), "h100", PlanPrices(1, 1, 1))
    out = plan_html(p)
    assert out.count("<tr>") == 9 + 1 + len(p.checklist)
    assert "?" in out  # the load test is always still to be done


def test_the_price_field_follows_the_gpu():
    """With a price per GPU type, choosing a GPU puts its example price in the field (and the
    plan uses it); a GPU without one gets 0 and the summary asks for a price."""
    from llminfra.planning.plan import EXAMPLE_GPU_HOUR_USD
    f = PlanForm(ServiceRequirements(50_000, 1500, 300), "h100",
                 PlanPrices(3, 15, None, gpu_hour_usd_by_gpu=EXAMPLE_GPU_HOUR_USD))
    assert f.gpu_hour.value == 2.69 and f.plan.gpu_hour_usd == 2.69
    f.gpu.value = "l40s"
    assert f.gpu_hour.value == 0.79 and f.plan.gpu == "l40s" and f.plan.gpu_hour_usd == 0.79
    f.gpu.value = "mi300x"
    assert f.gpu_hour.value == 0 and "no example price for mi300x" in f.summary.value
    f.gpu_hour.value = 2.0
    assert f.plan.gpu_hour_usd == 2.0 and "no example price" not in f.summary.value


def test_form_rows_wrap_in_a_narrow_column():
    """Issue 24: the form was wider than the notebook column; its rows of inputs now wrap."""
    import ipywidgets as widgets
    f = PlanForm(ServiceRequirements(100_000, 1000, 500), "h100", PlanPrices(3, 15, 3))
    rows = {id(c): w for w in _walk(f.widget) if isinstance(w, widgets.HBox) for c in w.children}
    for control in (f.requests, f.budget, f.api_out):     # first, middle and last row
        assert rows[id(control)].layout.flex_flow == "row wrap"


def _walk(w):
    yield w
    for child in getattr(w, "children", ()):
        yield from _walk(child)


def test_the_budget_changes_what_the_plan_says():
    """Issue 42: the budget field changed nothing visible. The plan now says whether its
    recommendation fits the budget, in the summary, the table and the reasons — and moving
    the budget across the recommendation's cost flips it."""
    f = PlanForm(ServiceRequirements(50_000, 1500, 300, budget_usd_per_month=20_000), "h100",
                 PlanPrices(3, 15, 2.69))
    cost = f.plan.recommended_monthly_usd
    assert f.plan.within_budget and "within the budget of 20,000" in f.summary.value
    assert "the recommendation fits it" in f.html.value
    f.budget.value = cost / 2
    assert not f.plan.within_budget and "OVER the budget" in f.summary.value
    assert "USD over it" in f.html.value
    assert any("over the budget" in r for r in f.plan.reasons)
    f.budget.value = cost
    assert f.plan.within_budget


def test_long_times_read_without_an_exponent():
    """A TTFT of 12.3 s reads 12,300 ms in the plan's table and checklist, not 1.23e+04."""
    import dataclasses
    from llminfra.planning.plan import checklist
    p = plan_deployment(ServiceRequirements(1000, 100, 100), "h100", PlanPrices(1, 1, 1))
    slow = dataclasses.replace(p, ttft_estimate_s=12.3)
    assert "12,300 ms" in plan_html(slow) and "e+0" not in plan_html(slow)
    rows = checklist(ServiceRequirements(1000, 100, 100), {**p.to_dict(), "ttft_estimate_s": 12.3},
                     type("B", (), {"weight_bytes": 16e9})())
    assert any(r["number"].startswith("12,300 ms") for r in rows)
