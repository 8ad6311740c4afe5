"""`llminfra models --json` and `llminfra gpus` say what their numbers are (issue 42)."""

from __future__ import annotations

import json

from llminfra.calc.params import active_param_count
from llminfra.cli import main
from llminfra.specs import get_model, gpu_names, get_gpu


def test_models_json_gives_both_active_counts_and_each_publishers_convention(capsys):
    """Active parameters with and without the input embedding (V·h apart, a lookup and not a
    product); for the presets with a published figure, which of the two it is."""
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, r in rows.items():
        s = get_model(name)
        assert r["active_params_with_input_embedding"] == r["active_params"]
        assert (r["active_params_with_input_embedding"] - r["active_params_without_input_embedding"]
                == s.vocab_size * s.hidden_size), name
    conventions = {n: r["published_params"]["active_convention"] for n, r in rows.items()
                   if "published_params" in r}
    assert conventions["deepseek-v3"] == "without the input embedding"
    assert conventions["mixtral-8x7b"] == "with the input embedding"
    # DeepSeek's 37 B is the count without the table: 37.55 B with it, 36.62 B without
    assert round(rows["deepseek-v3"]["active_params_without_input_embedding"] / 1e9) == 37
    assert rows["deepseek-v3"]["active_params_without_input_embedding"] == \
        active_param_count("deepseek-v3", include_input_embedding=False)


def test_gpus_table_names_each_rows_unit(capsys):
    """The memory column carries the vendor's unit (GiB for most cards), not a 'GB' header."""
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "memory GB" not in out.splitlines()[0]
    for name in gpu_names():
        g = get_gpu(name)
        line = next(l for l in out.splitlines() if l.split()[0] == name)
        assert f"{g.memory_gb:g} {g.memory_unit}" in line, line
