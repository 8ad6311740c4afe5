"""``bench serving-profile`` on the tiny model: the categories of a step add up to the step's
wall time, every request finishes, and the wrappers leave the engine as they found it.

Correctness only (no speed is checked). The tolerance of the sum: every wrapper adds its
exclusive time to one category and the step's own remainder to ``engine, other``, so the sum
equals the step wall time up to float rounding — 1e-9 s a step is far above that."""

from __future__ import annotations

import pytest

from llminfra.bench import serving_profile as sp
from llminfra.bench.step_profiler import STEP_CATEGORIES


def _check(result: dict, num_requests: int, max_output_tokens: int) -> None:
    run = result["profiled_run"]
    assert run["num_ok"] == num_requests and run["num_errors"] == 0, run["errors"]
    # ignore_eos: every request reaches its drawn length, capped at max_output_tokens
    assert 0 < run["output_tokens"] <= num_requests * max_output_tokens
    assert run["engine_generated_tokens"] == run["output_tokens"]
    steps = sum(result["steps"].values())
    assert result["steps"]["decode"] > 0 and steps > 0
    assert abs(result["categories_sum_s"] - result["step_wall_s"]) <= 1e-9 * steps
    step_rows = [r for r in result["categories"] if r["where"] == "engine step"]
    assert [r["category"] for r in step_rows] == [c for c, _ in STEP_CATEGORIES]
    assert all(r["seconds"] >= 0 for r in result["categories"])
    assert sum(r["share_of_step_wall"] for r in step_rows) == pytest.approx(1, rel=1e-9)
    # the fast runner's parts were all found (else their time hides in a caller's row)
    assert run["profile"]["missing"] == []
    for name in ("matmuls", "attention: K/V gather", "attention: SDPA", "scheduler",
                 "sampling", "detokenize"):
        assert next(r for r in step_rows if r["category"] == name)["seconds"] > 0, name
    # the steps (and the gaps between them) happened inside the client's run
    assert result["step_wall_s"] + run["profile"]["between_steps_s"] <= run["wall_s"] + 0.5
    assert 1 <= result["decode_batch_mean"] <= result["settings"]["concurrency"]
    assert "event loop" in sp.format_table(result)


def test_profile_on_the_c_kernels_times_them():
    """``--matmul skinny``: the fused matmuls (their RMSNorm / SwiGLU inside) and the C decode
    attention are timed as such; no gather, no SDPA in a decode step."""
    from llminfra.kernels import w4a8
    if not w4a8.available():
        pytest.skip(f"the C kernels do not build here: {w4a8.unavailable_reason()}")
    result = sp.profile_serving("tiny", concurrency=2, num_requests=4, max_output_tokens=8,
                                max_model_len=128, chars_per_token=1.0, repeats=1,
                                unprofiled=False, matmul="skinny")
    assert result["settings"]["matmul"] == "skinny"
    assert result["profiled_run"]["profile"]["missing"] == []
    decode = result["profiled_run"]["profile"]["seconds"]["decode"]
    assert decode["attention: C paged kernel"] > 0 and decode["matmuls"] > 0
    assert decode["attention: K/V gather"] == decode["attention: SDPA"] == 0


def test_profile_engine_process_adds_up():
    n, tokens = 6, 8
    result = sp.profile_serving("tiny", concurrency=3, num_requests=n, max_output_tokens=tokens,
                                max_model_len=128, chars_per_token=1.0, repeats=1,
                                unprofiled=False)
    assert result["settings"]["engine"] == "process"
    assert result["profiling_overhead"] is None
    _check(result, n, tokens)


def _llminfra_functions() -> dict:
    import sys
    return {(name, k): v for name, m in list(sys.modules.items())
            if name.startswith("llminfra.") and m is not None
            for k, v in list(vars(m).items()) if callable(v)}


def test_profile_engine_thread_adds_up_and_uninstalls():
    import llminfra.engine  # noqa: F401 - the engine's modules, before the snapshot
    import llminfra.serving.serve  # noqa: F401

    before = _llminfra_functions()
    n, tokens = 4, 6
    result = sp.profile_serving("tiny", concurrency=2, num_requests=n, max_output_tokens=tokens,
                                max_model_len=128, chars_per_token=1.0, engine_in_thread=True,
                                repeats=1)
    assert result["settings"]["engine"] == "thread"
    assert result["unprofiled_runs"][0]["num_ok"] == n
    _check(result, n, tokens)
    after = _llminfra_functions()
    changed = [key for key, fn in before.items() if after.get(key) is not fn]
    assert changed == [], f"still wrapped: {changed}"
