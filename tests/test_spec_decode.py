"""Speculative decoding: greedy output identical with and without it (any proposer, any γ, with
chunked prefill, prefix caching and both preemptions), no block leaks, sampled output
distributed as the target's (chi-square tests at a stated false-alarm rate), the formulas."""

import itertools
import math

import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams, SpeculativeConfig
from llminfra.engine.spec_decode import (PromptLookup, choose_gamma, expected_tokens_per_step,
                                         rejection_sample, verify_greedy)
from llminfra.model import ByteTokenizer, DenseKVCache, ModelConfig, Transformer, generate
from llminfra.runner.fast_decode import FastDecoder

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=96)
TOK = ByteTokenizer()
PROMPTS = ["the cat sat on the mat, the cat sat", "abcabcabc", "x", "def f(x):\n    return x",
           "speculative decoding is exact"]
#: false-alarm rate of each chi-square test below (a correct sampler fails it this often)
ALPHA_FALSE_ALARM = 1e-4


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def target():
    """float64, so that batching cannot flip a near-tie of the argmax by rounding."""
    return Transformer(CFG, generator=torch.Generator().manual_seed(77)).double().eval()


@pytest.fixture(scope="module")
def drafts(target):
    """Two draft decoders: the target itself (high acceptance) and an unrelated model (most
    drafts rejected, so the rollback is exercised)."""
    other = Transformer(CFG, generator=torch.Generator().manual_seed(5)).double().eval()
    return {"same": FastDecoder(target), "other": FastDecoder(other)}


def _alone(model, prompt, max_tokens):
    ids = TOK.encode(prompt)
    n = min(max_tokens, model.config.max_seq_len - len(ids) + 1)
    return generate(model, ids, n, cache=DenseKVCache(model.config.n_layers))


def _clock():
    ticks = itertools.count()
    return lambda: float(next(ticks))


def _spec(kind, gamma, drafts, adaptive=False):
    if kind == "ngram":
        return SpeculativeConfig("ngram", gamma, adaptive=adaptive)
    return SpeculativeConfig("draft", gamma, adaptive=adaptive, draft=drafts[kind])


@pytest.mark.parametrize("kind,gamma", [("ngram", 1), ("ngram", 4), ("same", 3), ("other", 2),
                                        ("other", 6)])
@pytest.mark.parametrize("setup", ["plain", "chunked+prefix", "preempt-recompute",
                                   "preempt-swap"])
def test_greedy_output_is_identical_with_speculation(target, drafts, kind, gamma, setup):
    kw = {"plain": {},
          "chunked+prefix": dict(max_num_batched_tokens=8, enable_prefix_caching=True,
                                 block_size=4),
          "preempt-recompute": dict(num_blocks=20, block_size=4, preemption="recompute"),
          "preempt-swap": dict(num_blocks=20, block_size=4, preemption="swap")}[setup]
    engine = LLMEngine(target, TOK, clock=_clock(), speculative=_spec(kind, gamma, drafts), **kw)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == _alone(target, prompt, 40), (prompt, kind, gamma)
    alloc = engine.cache.allocator
    assert alloc.num_free == alloc.num_blocks, "blocks leaked"
    stats = engine.stats()
    assert stats["spec_draft_tokens_total"] > 0
    if setup.startswith("preempt"):
        assert stats["num_preemptions"] > 0, "the pool was meant to force preemption"
    if kind == "same":
        assert stats["spec_acceptance_rate"] > 0.9
    if kind == "other":
        assert stats["spec_acceptance_rate"] < 0.9       # rejections did happen


def test_speculation_yields_several_tokens_per_step_and_counts_them(target, drafts):
    plain = LLMEngine(target, TOK, clock=_clock())
    spec = LLMEngine(target, TOK, clock=_clock(), speculative=_spec("same", 4, drafts))
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    a, b = plain.generate(PROMPTS[0], params)[0], spec.generate(PROMPTS[0], params)[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert spec.stats()["num_steps"] < plain.stats()["num_steps"] / 2
    m = b.metrics
    assert m.num_accepted_tokens <= m.num_draft_tokens and m.num_draft_tokens > 0
    assert len(m.token_times) == 30 == m.num_output_tokens     # one time per token, not per step


def test_a_request_can_turn_speculation_off_and_stops_are_kept(target, drafts):
    engine = LLMEngine(target, TOK, clock=_clock(), speculative=_spec("same", 4, drafts))
    off = engine.generate(PROMPTS[0], SamplingParams(max_tokens=20, ignore_eos=True,
                                                     num_speculative_tokens=0))[0]
    assert engine.stats()["spec_draft_tokens_total"] == 0
    want = TOK.decode(off.outputs[0].token_ids)
    stop = want[5:8]
    got = engine.generate(PROMPTS[0], SamplingParams(max_tokens=20, stop=stop))[0]
    assert got.outputs[0].finish_reason == "stop"
    assert got.outputs[0].text == want[:want.index(stop)]
    short = engine.generate(PROMPTS[0], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert short.outputs[0].token_ids == off.outputs[0].token_ids[:3]


def test_adaptive_gamma_stops_speculating_when_drafts_miss(target, drafts):
    engine = LLMEngine(target, TOK, clock=_clock(),
                       speculative=_spec("other", 4, drafts, adaptive=True))
    out = engine.generate(PROMPTS[1], SamplingParams(max_tokens=60, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == _alone(target, PROMPTS[1], 60)
    # with few drafts kept, the rule proposes on a fraction of the steps only
    assert engine.stats()["spec_verifications_total"] < 40


def test_prompt_lookup_proposes_what_followed_the_last_match():
    class S:                                          # the one method the proposer reads
        def __init__(self, ids):
            self.ids = ids

        def token_ids(self):
            return self.ids
    p = PromptLookup(1, 3)
    assert p.propose(S([1, 2, 3, 9, 9, 1, 2, 3]), 2) == [9, 9]
    assert p.propose(S([5, 6, 7]), 3) == []
    assert p.propose(S([4, 1, 4]), 5) == [1, 4]


def test_verify_greedy_keeps_the_matching_prefix_and_adds_one():
    logits = torch.eye(5)[[1, 2, 3, 4]]               # argmax 1, 2, 3, 4
    assert verify_greedy(logits, [1, 2, 0]) == [1, 2, 3]
    assert verify_greedy(logits, [1, 2, 3]) == [1, 2, 3, 4]
    assert verify_greedy(logits, [0, 2, 3]) == [1]


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness of fit; survival function of chi2(k - 1) via the regularised upper
    incomplete gamma, Q(k/2, x/2)."""
    n = float(counts.sum())
    keep = probs > 0
    expected = probs[keep] * n
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    assert float(counts[~keep].sum()) == 0, "a token of probability 0 was drawn"
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


@pytest.mark.parametrize("draft_kind", ["one-hot", "spread"])
def test_rejection_sampling_emits_the_target_distribution(draft_kind):
    """First token ~ p_0 and, given the first draft kept, the second ~ p_1, whatever q is."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05, 0.0], [0.05, 0.05, 0.1, 0.2, 0.3, 0.3],
                      [0.1, 0.1, 0.1, 0.1, 0.1, 0.5]], dtype=torch.float64)
    q = None if draft_kind == "one-hot" else torch.tensor(
        [[0.1, 0.6, 0.1, 0.1, 0.05, 0.05], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]], dtype=torch.float64)
    first, second = torch.zeros(6), torch.zeros(6)
    kept_first = 0
    for _ in range(6000):
        drafts = ([1, 3] if q is None
                  else [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)])
        out = rejection_sample(p, drafts, g, q)
        first[out[0]] += 1
        if len(out) >= 2:
            second[out[1]] += 1
            kept_first += 1
    assert kept_first > 500
    assert _chi2_pvalue(first, p[0]) > ALPHA_FALSE_ALARM
    assert _chi2_pvalue(second, p[1]) > ALPHA_FALSE_ALARM


def test_engine_sampling_with_speculation_matches_without(target, drafts):
    """Two-sample chi-square on the third token of 300 seeded requests (top-k 3 keeps the
    support small): the engine with drafts samples what the engine without does."""
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=s, ignore_eos=True)
              for s in range(300)]
    counts = []
    for spec in (None, _spec("other", 2, drafts)):
        engine = LLMEngine(target, TOK, clock=_clock(), speculative=spec, max_num_seqs=64)
        outs = engine.generate(["abcabc"] * len(params), params)
        c = torch.zeros(256)
        for o in outs:
            c[o.outputs[0].token_ids[2]] += 1
        counts.append(c)
        if spec is not None:
            assert engine.stats()["spec_verifications_total"] > 100
    a, b = counts
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    stat = float((((a - b) ** 2) / (a + b)).sum())   # equal sample sizes
    dof = int(keep.sum()) - 1
    pvalue = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                           torch.tensor(stat / 2.0, dtype=torch.float64)))
    assert pvalue > ALPHA_FALSE_ALARM, (pvalue, a, b)


def test_expected_tokens_and_gamma_rule():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert math.isclose(expected_tokens_per_step(0.5, 2), 1.75)
    assert choose_gamma(0.9, 6, 0.05) >= 4
    assert choose_gamma(0.1, 6, 0.3) == 0
    assert choose_gamma(0.9, 6, 0.05, cost_fixed=0.9) >= 4
    assert choose_gamma(0.5, 6, 0.05, cost_fixed=0.9) == 0     # a CPU's fixed cost: not worth it
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.5, 2)


def test_bad_speculative_settings_are_refused():
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig("eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig("ngram", 0)
    with pytest.raises(ValueError, match="draft"):
        SpeculativeConfig("draft")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SamplingParams(num_speculative_tokens=-1)


def test_server_with_speculation_answers_as_without_and_reports_it(one_thread):
    """``serve --speculative ngram`` over real HTTP: the official client gets the same greedy
    text, streamed and not, as from a server without it; ``/metrics`` counts the drafts."""
    import openai

    from llminfra.serving.background import ServerThread
    from llminfra.serving.serve import build_engine
    from llminfra.serving.server import create_app
    from server_helpers import metrics

    prompt = "Return the number of items in the list.\n\nReturn the number of items"
    texts = {}
    for spec in (None, "ngram"):
        engine = build_engine(speculative=spec, num_speculative_tokens=4)
        with ServerThread(create_app(engine, engine.tokenizer, model_name="m")) as srv:
            client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused",
                                   max_retries=0, timeout=60)
            whole = client.completions.create(model="m", prompt=prompt, max_tokens=64,
                                              temperature=0).choices[0].text
            streamed = "".join(c.choices[0].text for c in client.completions.create(
                model="m", prompt=prompt, max_tokens=64, temperature=0, stream=True))
            assert streamed == whole
            texts[spec] = whole
            m = metrics(srv)
            drafts = m.get("llminfra_spec_decode_num_draft_tokens_total", 0.0)
            assert (drafts > 0) == (spec is not None), m
            assert 0 <= m["llminfra_spec_decode_acceptance_rate"] <= 1
    assert texts["ngram"] == texts[None]
    with pytest.raises(ValueError, match="speculative"):
        build_engine(speculative="eagle")
