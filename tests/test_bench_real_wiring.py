"""bench real's engine rows, without transformers: ``engine`` is the engine ``serve`` builds by
default for the real model on this machine (the fast runner on the C kernels where they build,
on oneDNN's prepacked weights otherwise), ``engine_plain`` the readable runner on ``F.linear``;
each run records which path it took, and the two give the same greedy tokens. On the tiny
model's weights (the choice depends on the model's name, not its size), two short requests."""

import torch

from llminfra.bench import real
from llminfra.kernels import w4a8
from llminfra.model import load_model
from llminfra.runner import prepacked
from llminfra.runner.kernel_choice import resolve_matmul


def test_engine_rows_run_serve_s_default_path_and_say_so():
    model, tok = load_model("tiny")
    work = real.real_workload(2, torch.Generator().manual_seed(3), scale=0.0625,
                              max_seq_len=64, max_output=4)
    prompts = real.corpus_prompts(tok, work)
    sides = real.engine_sides(model, tok, work, prompts)
    assert set(sides) == set(real.ENGINE_SIDES)
    with torch.no_grad():
        runs = {side: run() for side, run in sides.items()}
    chosen = resolve_matmul("auto", real.MODEL)          # what serve's --matmul auto means here
    assert chosen == ("skinny" if prepacked.available() and w4a8.available() else
                      "onednn" if prepacked.available() else "plain")
    want = {"skinny": ("SkinnyMatmul", "C paged"), "onednn": ("PrepackedMatmul", "torch"),
            "plain": ("Matmul", "torch")}[chosen]
    path = runs["engine"]["path"]
    assert (path["runner"], path["matmul"], path["attention"]) == ("fast", *want)
    assert isinstance(path["one_call_step"], bool)
    assert runs["engine_plain"]["path"] == {"runner": "readable", "matmul": "plain"}
    assert runs["engine"]["tokens"] == runs["engine_plain"]["tokens"]
    assert [len(t) for t in runs["engine"]["tokens"]] == [r.output_len for r in work]
    assert runs["engine"]["throughput_tokens_per_s"] > 0
