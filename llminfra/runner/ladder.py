"""One rung of the ladder, written small: a matrix product that reads each weight once, its
floor, and the tools chapter 12 uses to show the C kernels and to time a decode step.

A product ``y = x · Wᵀ`` of ``M`` rows of ``x (M, K)`` with ``W (N, K)`` must at least read
every weight, read ``x`` and write ``y``. At ``b`` bytes a value and a memory bandwidth of
``β`` bytes/s (``GB/s`` here is 1e9 bytes/s, not GiB/s), its **floor** is

    t_floor = (N·K + M·K + M·N) · b / β                         (:func:`matvec_floor_s`)

and it stays the weights' ``N·K·b / β`` when ``M`` is small: the weights are read once for all
the rows of ``x``, never once a row. :func:`blocked_matvec` is that product taken a block of
``block_rows`` rows of ``W`` at a time (:func:`row_blocks`), each block read once and met by
every row of ``x`` — the loop ``f32_skinny.c`` runs in registers, four rows of ``W`` at a
time, and the exercise of chapter 12. :func:`weight_reads` watches which rows of ``W`` a
function's torch products read (how the chapter's checker sees the blocks).

:func:`c_function` finds a function of the C library's sources by name (the lines move as the
kernels change: no line numbers are typed anywhere), and :func:`decode_step_s` times the decode
steps of an engine. Chapter 12.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

#: the C library's sources (:mod:`llminfra.kernels`)
CSRC = Path(__file__).resolve().parents[1] / "kernels" / "csrc"
#: torch functions (by name) that multiply their operands: a weight passed to one is read
PRODUCTS = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "mv", "addmm", "addmv",
                      "linear", "einsum", "dot", "inner", "tensordot", "bmm", "baddbmm",
                      "mul", "__mul__", "__rmul__", "vdot", "outer"})


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def matvec_bytes(M: int, N: int, K: int, bytes_per_value: float) -> float:
    """The fewest bytes ``y = x · Wᵀ`` moves: ``(N·K + M·K + M·N) · b`` — W read once, x
    read once, y written once (chapter 12). ``ValueError`` for a size below 1 or ``b <= 0``."""
    for name, v in (("M", M), ("N", N), ("K", K)):
        _positive_int(name, v)
    return (N * K + M * K + M * N) * _positive("bytes_per_value", bytes_per_value)


def matvec_floor_s(M: int, N: int, K: int, bytes_per_value: float, gb_per_s: float) -> float:
    """The floor of ``y = x · Wᵀ`` in seconds: :func:`matvec_bytes` over the bandwidth
    ``gb_per_s · 1e9`` bytes/s (GB, not GiB). A 2048 × 2048 fp32 W, one row of x, at 20 GB/s:
    (4,194,304 + 2,048 + 2,048) · 4 / 2e10 = 0.8397 ms. Chapter 12."""
    return matvec_bytes(M, N, K, bytes_per_value) / (_positive("gb_per_s", gb_per_s) * 1e9)


def row_blocks(N: int, block_rows: int) -> list[tuple[int, int]]:
    """``[(0, b), (b, 2b), …, (…, N)]``: the rows of W in blocks of ``block_rows`` (the last
    may be shorter), each row in exactly one block. Chapter 12."""
    N, b = _positive_int("N", N), _positive_int("block_rows", block_rows)
    return [(start, min(start + b, N)) for start in range(0, N, b)]


def blocked_matvec(x: torch.Tensor, W: torch.Tensor, block_rows: int) -> torch.Tensor:
    """``x (M, K) · Wᵀ`` with ``W (N, K)``, a block of ``block_rows`` rows of W at a time:
    ``y[:, i:j] = x · W[i:j]ᵀ`` for each ``(i, j)`` of :func:`row_blocks` — every weight read
    once, by one product that every row of x meets. Equals ``x @ W.T`` (the same dot product
    per output). Chapter 12's exercise 2."""
    if x.ndim != 2 or W.ndim != 2 or x.shape[1] != W.shape[1]:
        raise ValueError(f"x must be (M, K) and W (N, K), got {tuple(x.shape)} and "
                         f"{tuple(W.shape)}")
    y = torch.empty(x.shape[0], W.shape[0], dtype=torch.result_type(x, W), device=x.device)
    for i, j in row_blocks(W.shape[0], block_rows):
        y[:, i:j] = x @ W[i:j].T                          # (M, K) · (K, j - i)
    return y


# --------------------------------------------------------------- which rows a product reads
def _rows_of(view: torch.Tensor, W: torch.Tensor) -> tuple[int, int] | None:
    """The rows ``(start, stop)`` of ``W`` that ``view`` (a view of W's storage) holds: a
    slice of W's rows or its transpose, whole rows; None for any other view."""
    if view.untyped_storage().data_ptr() != W.untyped_storage().data_ptr():
        return None
    K, row = W.shape[1], W.stride(0)
    offset = view.storage_offset() - W.storage_offset()
    if offset % row:
        return None
    start = offset // row
    if view.ndim == 1 and view.shape[0] == K and view.stride(0) == W.stride(1):
        return start, start + 1
    if view.ndim != 2:
        return None
    if view.shape[1] == K and view.stride() == (row, W.stride(1)):
        return start, start + view.shape[0]
    if view.shape[0] == K and view.stride() == (W.stride(1), row):     # W[i:j].T
        return start, start + view.shape[1]
    return None


class _Reads(torch.overrides.TorchFunctionMode):
    """Records the rows of ``W`` each product reads, and any other use of W's storage."""

    def __init__(self, W: torch.Tensor):
        super().__init__()
        self.W, self.reads, self.other = W, [], set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in PRODUCTS:
            for a in list(args) + list(kwargs.values()):
                if torch.is_tensor(a) and a.untyped_storage().data_ptr() \
                        == self.W.untyped_storage().data_ptr():
                    rows = _rows_of(a, self.W)
                    if rows is None:
                        self.other.add(name)
                    else:
                        self.reads.append(rows)
        elif name in ("numpy", "tolist", "__array__") and args and args[0] is self.W:
            self.other.add(name)
        return func(*args, **kwargs)


@dataclass(frozen=True)
class WeightReads:
    """What :func:`weight_reads` saw: ``result`` of the call, ``reads`` (the rows of W each
    product read, in call order) and ``other`` (names of calls that used W some other way)."""

    result: object
    reads: list
    other: frozenset


def weight_reads(fn, x, W: torch.Tensor, *args, **kwargs) -> WeightReads:
    """Call ``fn(x, W, *args, **kwargs)`` and record which rows of ``W`` each torch product
    (:data:`PRODUCTS`) read. The products of ``row_blocks``' blocks read each row once:
    ``sorted(reads) == row_blocks(N, b)``. Chapter 12's checker."""
    with _Reads(W) as mode:
        result = fn(x, W, *args, **kwargs)
    return WeightReads(result, list(mode.reads), frozenset(mode.other))


def read_problem(reads: list, N: int, block_rows: int) -> str | None:
    """None when the row ranges ``reads`` cover rows ``0 .. N - 1`` of W exactly once, each at
    most ``block_rows`` rows; else what is wrong, in words (the first row read twice or never,
    the first block that is too large). Chapter 12."""
    if not reads:
        return "no torch product read W's rows"
    big = next(((i, j) for i, j in reads if j - i > block_rows), None)
    if big is not None:
        return (f"a product read rows {big[0]}..{big[1] - 1} of W at once ({big[1] - big[0]} "
                f"rows), more than block_rows = {block_rows}")
    count = [0] * N
    for i, j in reads:
        for r in range(max(i, 0), min(j, N)):
            count[r] += 1
    twice = next((r for r, c in enumerate(count) if c > 1), None)
    if twice is not None:
        return f"row {twice} of W was read {count[twice]} times (each weight once: a block each)"
    never = next((r for r, c in enumerate(count) if c == 0), None)
    if never is not None:
        return f"row {never} of W was never read by a product"
    return None


# ------------------------------------------------------------------------- the C sources
_DEFINITION = r"^[A-Za-z_][\w \t\*()]*?\b{name}\s*\("


def c_function(file: str, name: str, max_lines: int | None = None) -> tuple[int, list[str]]:
    """``(first line number, lines)`` of the definition of C function ``name`` in
    ``llminfra/kernels/csrc/<file>``, with the comment block just above it, up to its closing
    brace (at most ``max_lines`` lines, then ``"    …"``). ``ValueError`` for a missing file or
    a function with no definition there (a prototype ending in ``;`` is not one)."""
    path = CSRC / file
    if not path.is_file():
        raise ValueError(f"no C source {file!r} in {CSRC}; there are "
                         f"{sorted(p.name for p in CSRC.glob('*.[ch]'))}")
    lines = path.read_text().splitlines()
    pattern = re.compile(_DEFINITION.format(name=re.escape(name)))
    for at, line in enumerate(lines):
        if pattern.match(line) and _opens_body(lines, at):
            return _with_comment(lines, at, max_lines)
    raise ValueError(f"{file} defines no function {name!r}")


def _opens_body(lines: list[str], at: int) -> bool:
    """Whether the declaration starting at ``at`` has a body (``{`` before any ``;``)."""
    for line in lines[at:at + 12]:
        for ch in line:
            if ch == "{":
                return True
            if ch == ";":
                return False
    return False


def _with_comment(lines: list[str], at: int, max_lines: int | None) -> tuple[int, list[str]]:
    start = at
    while start > 0 and lines[start - 1].strip() and not lines[start - 1].rstrip().endswith(
            ("}", ";")) and not lines[start - 1].startswith("#"):
        start -= 1
    depth, end, opened = 0, at, False
    for end in range(at, len(lines)):
        depth += lines[end].count("{") - lines[end].count("}")
        opened = opened or "{" in lines[end]
        if opened and depth <= 0:
            break
    body = lines[start:end + 1]
    if max_lines is not None and len(body) > max_lines:
        body = body[:max_lines] + ["    …"]
    return start + 1, body


def show_c(file: str, name: str, max_lines: int | None = None) -> None:
    """Print :func:`c_function` under the file and line it starts at (as
    :func:`llminfra.course.notebook.show_source` prints Python). Chapter 12."""
    start, lines = c_function(file, name, max_lines)
    print(f"// llminfra/kernels/csrc/{file}, line {start}")
    print("\n".join(lines))


# ------------------------------------------------------------------------------- timing
def decode_step_s(engine, steps: int = 8) -> float:
    """The shortest of ``steps`` timed ``engine.step()`` calls (``time.perf_counter``), each a
    decode step when every request has passed its prompt; ``ValueError`` when the engine runs
    out of work before ``steps`` steps. Chapter 12."""
    _positive_int("steps", steps)
    best = float("inf")
    for _ in range(steps):
        if not engine.has_unfinished_requests():
            raise ValueError(f"the engine finished before {steps} timed steps: give its "
                             "requests more max_tokens")
        t0 = time.perf_counter()
        engine.step()
        best = min(best, time.perf_counter() - t0)
    return best


def decode_steps_s(engines: dict, steps: int = 8) -> dict:
    """``{name: shortest step (s)}`` of the ``engines`` (``{name: engine}``), stepped in turn —
    one step of each, ``steps`` rounds — so that load from elsewhere on a shared machine hits
    every engine alike (as ``bench roofline`` interleaves its weight formats). ``ValueError``
    as :func:`decode_step_s`. Chapter 12."""
    _positive_int("steps", steps)
    best = {name: float("inf") for name in engines}
    for _ in range(steps):
        for name, engine in engines.items():
            best[name] = min(best[name], decode_step_s(engine, 1))
    return best


__all__ = ["CSRC", "PRODUCTS", "WeightReads", "blocked_matvec", "c_function", "decode_step_s",
           "decode_steps_s",
           "matvec_bytes", "matvec_floor_s", "read_problem", "row_blocks", "show_c",
           "weight_reads"]
