"""The tables a learner reads, checked as they are stored in the chapters (what JupyterLab
shows when a chapter is opened; nbval keeps the stored HTML equal to what a run produces).

Every table of chapters 02 to 12 is made by
:func:`llminfra.plots.table.show_table`
and reads well in a 1440-px-wide JupyterLab: no ``NaN`` / ``nan`` / ``None`` shown, no header
written as code (``tpot_ms``), no text cut ("systems fro…"), no number as ``4.302e+04``, text
columns left-aligned (JupyterLab right-aligns every cell unless told), and the table's estimated
width within the notebook column.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from llminfra.plots.table import TABLE_CLASS, format_number, show_table

ROOT = Path(__file__).resolve().parents[1]
#: the chapters whose tables all go through ``show_table`` (add a chapter once its tables do)
CHAPTERS = ["02_gpu_memory", "03_precision_and_quantization", "04_kv_cache_and_paged_attention",
            "05_serving_and_continuous_batching", "06_flash_attention",
            "07_tensor_and_pipeline_parallelism", "08_gpu_hardware_and_roofline",
            "09_deployment_and_cost", "10_capstone_plan_a_deployment", "11_beyond_one_engine",
            "12_making_it_fast"]
#: JupyterLab at 1440 px with its file browser open leaves ~1,000 px for an output (994 px
#: measured in Chromium on nbconvert's lab page at that width); a table's text is estimated at
#: 7 px per character of JupyterLab's 13-px table font, plus 2 × 0.6 em of padding per column
COLUMN_PX, CHAR_PX, PAD_PX = 1000, 7.0, 16
#: a number as shown: 1,979 / 0.8642 / 3.403×10³⁸ / 12.3% / 1.5e-05 (the last is a problem)
NUMBER = re.compile(r"^[-+−]?[\d,]*\.?\d+(e[-+]\d+|×10⁻?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)?\s*(%|×|x)?$")
CODE_NAME = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]")


class _Table(HTMLParser):
    """The parts of a Styler's HTML the checks read: its CSS rules, its table class, its
    column headers, and each data cell's text and column."""

    def __init__(self):
        super().__init__()
        self.css, self.classes, self.headers, self.cells = "", [], [], []
        self._in, self._text, self._cls, self._head = None, "", "", False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._head = self._head or tag == "thead"
        if tag == "table":
            self.classes.append(a.get("class") or "")
        if tag in ("style", "th", "td"):
            self._in, self._text, self._cls = tag, "", a.get("class") or ""

    def handle_endtag(self, tag):
        self._head = self._head and tag != "thead"
        if tag != self._in:
            return
        if tag == "style":
            self.css += self._text
        elif tag == "th":
            where = " in_head" if self._head else ""
            self.headers.append((self._cls + where, self._text.strip()))
        else:
            col = re.search(r"\bcol(\d+)\b", self._cls)
            self.cells.append((int(col.group(1)) if col else -1, self._text.strip()))
        self._in = None

    def handle_data(self, data):
        if self._in:
            self._text += data


def _rules(css: str) -> list[tuple[list[str], str]]:
    return [([s.strip() for s in sel.split(",")], body)
            for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)]


def _left_aligned(rules, col: int) -> bool:
    return any(re.search(rf"\btd\.col{col}$", s) and re.search(r"text-align:\s*left", body)
               for sels, body in rules for s in sels)


def _wraps(rules, col: int) -> bool:
    """Whether column ``col``'s cells may wrap (a rule for ``td.colN`` says ``white-space:
    normal``; the table's cells are ``nowrap`` otherwise)."""
    return any(re.search(rf"\btd\.col{col}$", s) and re.search(r"white-space:\s*normal", body)
               for sels, body in rules for s in sels)


def min_width_px(t: _Table) -> float:
    """The narrowest the browser can lay the table out (its min-content width): per column the
    widest unbreakable piece — a whole cell where cells do not wrap, else its longest word;
    a header's longest word — plus padding. Wider than the column, the table is cut (scrolled)."""
    rules = _rules(t.css)
    widths: dict[int, float] = {}
    for col, text in t.cells:
        piece = max(map(len, text.split()), default=0) if _wraps(rules, col) else len(text)
        widths[col] = max(widths.get(col, 0), piece * CHAR_PX)
    row_heads = 0.0
    for cls, text in t.headers:
        m = re.search(r"\bcol(\d+)\b", cls)
        if m and "col_heading" in cls:
            c = int(m.group(1))
            widths[c] = max(widths.get(c, 0), max(map(len, text.split()), default=0) * CHAR_PX)
        elif "row_heading" in cls:
            row_heads = max(row_heads, len(text) * CHAR_PX)
    return sum(widths.values()) + row_heads + PAD_PX * (len(widths) + (row_heads > 0))


def problems(html: str) -> list[str]:
    """What a learner would trip over in one stored table (empty: it reads well)."""
    t = _Table()
    t.feed(html)
    out = []
    if not any(TABLE_CLASS in c for c in t.classes):
        out.append("not made by llminfra.plots.table.show_table (pandas' plain repr)")
    shown = [text for _, text in t.cells] + [text for _, text in t.headers]
    out += [f"missing value shown as {s!r}" for s in shown if s in ("NaN", "nan", "None", "<NA>")]
    out += [f"header written as code: {h!r}" for cls, h in t.headers
            if "in_head" in cls and CODE_NAME.search(h)]
    out += [f"text cut: {s!r}" for s in shown if s.endswith(("...", "…"))]
    out += [f"number with an exponent: {s!r}" for s in shown if re.search(r"\de\+\d", s)]
    rules = _rules(t.css)
    text_cols = sorted({c for c, s in t.cells if s and not NUMBER.match(s) and s != "—"})
    out += [f"text column {c} ({next(s for k, s in t.cells if k == c)!r}) is not left-aligned"
            for c in text_cols if not _left_aligned(rules, c)]
    if (w := min_width_px(t)) > COLUMN_PX:
        out.append(f"at least {w:.0f} px wide: wider than the notebook column ({COLUMN_PX} px)")
    return out


def stored_tables(chapter: str) -> list[tuple[int, str]]:
    nb = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    out = []
    for i, cell in enumerate(nb["cells"]):
        for o in cell.get("outputs", []):
            html = "".join(o.get("data", {}).get("text/html", ""))
            if "<table" in html:
                out.append((i, html))
    return out


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_stored_table_reads_well(chapter):
    tables = stored_tables(chapter)
    assert tables, f"{chapter} shows no table"
    found = [f"cell {i}: {p}" for i, html in tables for p in problems(html)]
    assert not found, f"{chapter}:\n" + "\n".join(found)


# --- the helper itself ---------------------------------------------------------------------

def test_the_checks_see_what_pandas_shows_by_default():
    """pandas' own HTML repr of a frame with a NaN, a code-name header, a long text and a big
    float: every problem is named."""
    df = pd.DataFrame({"gpu_name": ["l40s", "h100"], "note": ["announced 2023-08, systems "
                       "from the fall, with a long tail of text " * 2, "ok"],
                       "USD": [43021.7, np.nan]})
    with pd.option_context("display.max_colwidth", 50, "display.float_format", "{:.4g}".format):
        found = " | ".join(problems(df._repr_html_()))
    for what in ("not made by", "missing value", "header written as code", "text cut",
                 "number with an exponent", "not left-aligned"):
        assert what in found, (what, found)


def test_table_fixes_what_the_checks_see():
    df = pd.DataFrame({"gpu_name": ["l40s", "h100"],
                       "note": ["announced 2023-08 (SIGGRAPH 2023), systems from the fall " * 3,
                                "ok"],
                       "USD": [43021.7, np.nan], "fits": [True, False]})
    with pytest.raises(ValueError, match="gpu_name"):
        show_table(df)
    html = show_table(df, {"gpu_name": "GPU", "USD": "price (USD)"}).to_html()
    assert problems(html) == []
    assert "43,020" in html and "—" in html and ">yes<" in html
    assert df["note"][0].strip() in html, "long text is kept whole"
    assert html == show_table(df, {"gpu_name": "GPU", "USD": "price (USD)"}).to_html(), "stable"
    assert "row0" in html and ">0<" not in html, "the 0, 1, 2 … index is hidden"


def test_too_wide_a_table_is_seen():
    wide = pd.DataFrame([{f"column number {i} (GB)": 12345.678 * i for i in range(20)}])
    assert any("wider than the notebook column" in p for p in problems(show_table(wide).to_html()))


@pytest.mark.parametrize("value,shown", [(43021.7, "43,020"), (1979.0, "1,979"), (989.4, "989.4"),
                                         (0.86424, "0.8642"), (7, "7"), (np.int64(15446), "15,446"),
                                         (float("nan"), "—"), (None, "—"), (np.bool_(True), "yes"),
                                         (65504.0, "65,504"), (3.4028e38, "3.403×10³⁸"),
                                         (1.5e-5, "1.5×10⁻⁵"), (-2.0e9, "-2×10⁹")])
def test_format_number(value, shown):
    assert format_number(value) == shown


def test_formats_and_index():
    df = pd.DataFrame({"share": [0.1234, np.nan]}, index=pd.Index(["a", "b"], name="design"))
    html = show_table(df, formats={"share": "{:.1%}"}).to_html()
    assert "12.3%" in html and "—" in html and ">design<" in html and problems(html) == []


# --- the widgets' own tables (chapters 03, 06, 09 and 10) ------------------------------------

class _Rows(HTMLParser):
    """Each table row as a list of ``(is_header, inline text-align, text)``."""

    def __init__(self):
        super().__init__()
        self.rows, self._open = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            m = re.search(r"text-align:\s*(\w+)", dict(attrs).get("style") or "")
            self._open = [tag == "th", m.group(1) if m else None, ""]

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._open:
            self.rows[-1].append((self._open[0], self._open[1], self._open[2].strip()))
            self._open = None

    def handle_data(self, data):
        if self._open:
            self._open[2] += data


def widget_table_problems(html: str) -> list[str]:
    """A widget's HTML table has no stylesheet of JupyterLab's: every cell says its alignment —
    left in a column of text, right in a column of numbers (header included) — and nothing is
    shown as Python prints it (``nan``, ``inf``, ``None``). A number column may hold "—" for a
    missing value."""
    p = _Rows()
    p.feed(html)
    cells = [c for row in p.rows for c in row]
    out = [f"{s!r} shown as Python prints it" for _, _, s in cells
           if s in ("nan", "inf", "-inf", "None")]
    n = max((len(r) for r in p.rows), default=0)
    for j in range(n):
        column = [r[j] for r in p.rows if len(r) == n]
        data = [s for is_head, _, s in column if not is_head]
        want = "right" if data and all(NUMBER.match(s) or s in ("NaN", "∞", "-∞", "—")
                                       for s in data) and set(data) != {"—"} else "left"
        out += [f"{s!r} is aligned {align or 'by default'}, not {want}"
                for _, align, s in column if align != want]
    return out


def test_the_number_format_widget_table():
    from llminfra.widgets.number_format import encoding_html
    assert widget_table_problems("<table><tr><td>fp8</td><td>nan</td></tr></table>")   # can fail
    assert widget_table_problems("<table><tr><th>x</th></tr><tr><td>1.5</td></tr></table>")
    for value in (0.1, 1000.0, -3.5e-9, 70000.0):     # 1000: e4m3 stores NaN; 70000: fp16 ∞
        html = encoding_html(value)
        assert widget_table_problems(html) == [], (value, widget_table_problems(html))
    assert ">NaN<" in encoding_html(1000.0) and ">∞<" in encoding_html(70000.0)


def test_the_plan_form_tables():
    from llminfra.planning import PlanPrices, ServiceRequirements, plan_deployment
    from llminfra.widgets.plan_form import plan_html
    plan = plan_deployment(ServiceRequirements(50_000, 1500, 300), "h100", PlanPrices(3, 15, 2.69))
    for table in re.findall(r"<table>.*?</table>", plan_html(plan), flags=re.S):
        assert widget_table_problems(table) == [], widget_table_problems(table)


def test_the_tile_stepper_table():
    """Chapter 06's stepper: every step's table (running max, running sum: numbers, right)."""
    from llminfra.attention.tile_trace import tile_trace
    from llminfra.widgets.tile_stepper import step_html
    g = torch.Generator().manual_seed(0)
    trace = tile_trace(*(torch.randn(12, 4, generator=g) for _ in range(3)), True, 4, 4)
    for step in range(len(trace.steps)):
        table = re.search(r"<table>.*</table>", step_html(trace, step), flags=re.S).group(0)
        assert widget_table_problems(table) == [], (step, widget_table_problems(table))


@pytest.mark.parametrize("requests_per_day,utilization", [(1000, 0.5), (1e5, 0.5), (1e7, 0.05)])
def test_the_deployment_advisor_table(requests_per_day, utilization):
    """Chapter 09's advisor, up to its sliders' ends (12,000,000 M tokens a month: 92,593
    GPUs): numbers right-aligned and grouped, never "92593" or "1.2e+07"."""
    from llminfra.calc.deployment import Prices
    from llminfra.widgets.deployment_advisor import advice_html, advise
    prices = Prices(5.4, 2.69, 1.544, 1000)
    d = advise(prices, requests_per_day, 32_000 if requests_per_day > 1e6 else 2_000,
               8_000 if requests_per_day > 1e6 else 500, has_gpu_team=True,
               utilization=utilization, api_prices_per_million=(3, 15))
    table = re.search(r"<table.*</table>", advice_html(d), flags=re.S).group(0)
    assert widget_table_problems(table) == [], widget_table_problems(table)
    p = _Rows()
    p.feed(table)
    gpus = [row[3][2] for row in p.rows[1:]]
    assert all(g == "—" or NUMBER.match(g) for g in gpus), gpus
    if requests_per_day == 1e7:
        assert "92,593" in gpus


def test_chapter_09s_claims_table_names_each_claim():
    """The closing table of chapter 09 gives each claim its ledger id, so that the verdict test
    (``tests/test_ledger_verdicts.py``) reads every row: each row's label is the ledger's, and
    the rows cover every claim the ledger places in chapter 09."""
    from test_ledger_verdicts import html_flags

    from llminfra.ledger import all_claims, get_claim
    tables = [html for _, html in stored_tables("09_deployment_and_cost") if "appendix A1" in html]
    assert len(tables) == 1, "one claims table, its id column headed 'claim (appendix A1)'"
    p = _Rows()
    p.feed(tables[0])
    flags = html_flags(tables[0])
    assert len(flags) == len(p.rows) - 1, "every row has one id and one verdict label"
    assert all(label == get_claim(claim).verdict for claim, label in flags), flags
    assert {c for c, _ in flags} >= {c.id for c in all_claims() if "09" in c.chapters}
