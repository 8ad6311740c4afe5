"""Tables a learner reads: a DataFrame shown as an HTML table that fits a notebook column.

pandas' plain HTML repr cuts text at 50 characters ("systems fro…"), prints ``NaN`` for a
missing value and numbers such as ``4.302e+04``, and JupyterLab right-aligns every cell, text
included. :func:`show_table` returns the frame's ``Styler`` instead, with

* human headers: a code name such as ``tpot_ms`` is refused (rename it, with its unit:
  ``"TPOT (ms)"``); headers wrap instead of widening their column;
* numbers to ``digits`` significant digits, thousands grouped (``29,410``, never ``2.941e+04``;
  ``3.403×10³⁸`` for the very large), right-aligned; a missing value as "—";
* text left-aligned, never cut: a name (up to ``SHORT_TEXT`` characters) on one line, longer
  text wrapped at ``text_width_em``;
* no ``0, 1, 2 …`` index column; a fixed element id, so the HTML is the same on every run
  (nbval compares it).

Used for the tables of chapters 02 to 10 (``tests/test_tables_read_well.py``
checks their stored outputs).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from typing import Callable

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

#: the class every table made here carries (the tests find the course's tables by it)
TABLE_CLASS = "llminfra-table"
#: a header written as code: two word characters joined by "_" (``tpot_ms``, ``gpu_hour_usd``)
CODE_NAME = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]")
MISSING = "—"
#: text up to this many characters stays on one line (a name); longer text wraps
SHORT_TEXT = 24


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _is_missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def format_number(v, digits: int = 4) -> str:
    """``v`` to ``digits`` significant digits, as a person writes it.

    Grouped thousands instead of an exponent: ``format_number(43021.7)`` is ``"43,020"``, a
    whole number is kept whole (``65504.0`` -> ``"65,504"``); below 1,000 ``0.8642``, ``7``;
    from 10⁹ up and under 10⁻⁴ a power of ten, ``"3.403×10³⁸"``. A bool reads ``"yes"`` /
    ``"no"``, a missing value "—".
    """
    if _is_missing(v):
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    x = float(v)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x != 0 and (abs(x) >= 1e9 or abs(x) < 1e-4):
        mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"
    if isinstance(v, numbers.Integral) or x.is_integer():
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{float(f'{x:.{digits}g}'):,.0f}"
    return f"{x:.{digits}g}"


def _is_number(v) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, (bool, np.bool_))


def text_columns(df: pd.DataFrame) -> list[int]:
    """Positions of the columns that hold text (anything but numbers and missing values)."""
    return [j for j in range(df.shape[1])
            if any(not _is_number(v) and not _is_missing(v) for v in df.iloc[:, j])]


def _labels(index: pd.Index) -> list[str]:
    names = [n for n in index.names if n is not None]
    flat = [x for label in index for x in (label if isinstance(label, tuple) else (label,))]
    return [str(x) for x in names + flat]


def code_names(df: pd.DataFrame) -> list[str]:
    """The column headers (and index names) written as code, e.g. ``["tpot_ms"]``."""
    names = [n for n in df.index.names if n is not None]
    return [h for h in _labels(df.columns) + [str(n) for n in names] if CODE_NAME.search(h)]


def _uuid(df: pd.DataFrame, styles: list[dict]) -> str:
    """A short id fixed by the table's headers, shape and styles (same table, same HTML; two
    tables styled differently never share an id, so neither takes the other's CSS)."""
    key = repr((_labels(df.columns), df.shape, styles)).encode()
    return "t" + hashlib.sha1(key).hexdigest()[:8]


def _cell(fmt: Callable | str | None, digits: int) -> Callable:
    if callable(fmt):
        return lambda v: MISSING if _is_missing(v) else fmt(v)
    if isinstance(fmt, str):
        return lambda v: MISSING if _is_missing(v) else fmt.format(v)
    return lambda v: (format_number(v, digits) if _is_number(v) or _is_missing(v)
                      or isinstance(v, (bool, np.bool_)) else str(v))


def show_table(df: pd.DataFrame, headers: dict | None = None, *, formats: dict | None = None,
               digits: int = 4, text_width_em: float = 28, header_width_em: float = 9,
               uuid: str | None = None) -> Styler:
    """``df`` as a table that reads well (see the module's docstring); returns a ``Styler``.

    ``headers`` renames columns (``{"tpot_ms": "TPOT (ms)"}``); ``formats`` maps a column
    (its new name) to a format string (``"{:.1%}"``) or a function of the value, for the
    columns whose default ``digits`` significant digits do not suit. Raises ``ValueError`` for
    a header left as a code name. A default ``0, 1, 2 …`` index is hidden; any other index is
    shown as the rows' names.
    """
    df = df.rename(columns=headers) if headers else df
    if bad := code_names(df):
        raise ValueError(f"headers written as code: {bad}; rename them, with their units "
                         "(headers={'tpot_ms': 'TPOT (ms)'})")
    formats = formats or {}
    text = text_columns(df)
    styler = df.style.format({c: _cell(formats.get(c), digits) for c in df.columns})
    styler = styler.format_index(lambda v: format_number(v, digits) if _is_number(v) else str(v))
    if isinstance(df.index, pd.RangeIndex) and df.index.name is None:
        styler = styler.hide(axis="index")
    styles = [
        {"selector": "th, td", "props": "vertical-align: top; padding: 0.25em 0.6em;"},
        {"selector": "th.col_heading",
         "props": f"text-align: right; vertical-align: bottom; white-space: normal; "
                  f"max-width: {header_width_em}em;"},
        {"selector": "th.row_heading, th.index_name, th.blank",
         "props": "text-align: left; white-space: nowrap;"},
        {"selector": "td", "props": "text-align: right; white-space: nowrap; "
                                    "font-variant-numeric: tabular-nums;"},
    ]
    for j in text:
        longest = max(len(str(v)) for v in df.iloc[:, j])
        wrap = (f"white-space: normal; max-width: {text_width_em}em;" if longest > SHORT_TEXT
                else "white-space: nowrap;")        # names such as "a100-80gb": never broken
        styles.append({"selector": f"td.col{j}", "props": f"text-align: left; {wrap}"})
        styles.append({"selector": f"th.col_heading.col{j}", "props": "text-align: left;"})
    return (styler.set_table_styles(styles)
            .set_table_attributes(f'class="{TABLE_CLASS}"')
            .set_uuid(uuid or _uuid(df, styles)))
