"""The block-table widget: step through a small paged workload and watch the pool.

:func:`replay` runs a list of events on the real
:class:`~llminfra.kvcache.blocks.BlockAllocator` and
:class:`~llminfra.kvcache.blocks.BlockTable` and returns, after every event, the block
tables, reference counts, free list and which blocks were copied (copy-on-write).
:class:`BlockTableWidget` wires a step slider to that list through ``observe`` (an ``HTML``
value and an ``Image`` value; no ``interact``, no printing), so it behaves the same in
JupyterLab, in a test and under nbval.

Events are tuples: ``("new", name, n_tokens)`` a request arrives with a prompt of n tokens;
``("append", name, n)`` it stores n more tokens; ``("fork", child, parent)`` a parallel sample
(or beam) shares the parent's blocks; ``("free", name)`` it finishes.

Design: Kwon et al., 2023, arXiv:2309.06180, §4.2–4.4, Figs. 6–8. Taught in chapter 04.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from llminfra.kvcache.blocks import BlockAllocator, BlockPoolExhausted, BlockTable
from llminfra.plots.kvcache import block_pool_png
from llminfra.widgets.panel import Panel, natural_size

#: a request, a second one, decoding, a fork (copy-on-write), a finish, a newcomer reusing
#: freed blocks, and a last append that finds the pool exhausted
DEFAULT_WORKLOAD = (
    ("new", "A", 6), ("new", "B", 3), ("append", "A", 3), ("fork", "A2", "A"),
    ("append", "A2", 1), ("append", "A", 1), ("free", "B"), ("new", "C", 9),
    ("append", "A2", 4), ("free", "A"), ("new", "D", 12), ("append", "C", 4),
)


def _snapshot(event: str, alloc: BlockAllocator, tables: dict, copies: list) -> dict:
    B = alloc.block_size
    holders = {b: [] for b in range(alloc.num_blocks)}
    filled = [0] * alloc.num_blocks
    for name, t in tables.items():
        for j, b in enumerate(t.blocks):
            holders[b].append(name)
            filled[b] = max(filled[b], min(B, t.num_tokens - j * B))
    return {"event": event, "num_blocks": alloc.num_blocks, "block_size": B,
            "tables": {n: {"blocks": list(t.blocks), "num_tokens": t.num_tokens}
                       for n, t in tables.items()},
            "ref_counts": alloc.ref_counts(), "free_list": alloc.free_list(),
            "holders": holders, "filled": filled, "copies": list(copies)}


def _apply(ev: tuple, alloc: BlockAllocator, tables: dict) -> tuple[str, list]:
    op, name = ev[0], ev[1]
    if op == "new":
        tables[name] = BlockTable(alloc)
        _, copies = tables[name].append(ev[2])
        return f"{name} arrives with {ev[2]} prompt tokens", copies
    if op == "append":
        _, copies = tables[name].append(ev[2])
        return f"{name} stores {ev[2]} more token(s)", copies
    if op == "fork":
        tables[name] = tables[ev[2]].fork()
        return f"{name} forks from {ev[2]} (shares its blocks)", []
    if op == "free":
        tables.pop(name).free()
        return f"{name} finishes (its blocks lose a holder)", []
    raise ValueError(f"unknown event {ev!r}; ops are 'new', 'append', 'fork', 'free'")


def replay(events=DEFAULT_WORKLOAD, num_blocks: int = 10, block_size: int = 4) -> list[dict]:
    """The pool's state before any event and after each one (``len(events) + 1`` states).

    An event that needs more blocks than are free leaves the pool unchanged and says so in the
    state's ``event`` text (the pool-exhausted message: preempt, swap or wait).
    """
    alloc, tables = BlockAllocator(num_blocks, block_size), {}
    states = [_snapshot("empty pool", alloc, tables, [])]
    for ev in events:
        try:
            text, copies = _apply(ev, alloc, tables)
        except BlockPoolExhausted:
            text, copies = f"{ev[1]}: pool exhausted — preempt, swap or wait", []
        if copies:
            text += "; copy-on-write " + ", ".join(f"block {s} -> {d}" for s, d in copies)
        states.append(_snapshot(text, alloc, tables, copies))
    return states


def state_text(state: dict) -> str:
    """Plain-text view of a state: block tables, reference counts of used blocks, free list."""
    lines = [state["event"]]
    for name, t in sorted(state["tables"].items()):
        lines.append(f"  {name}: blocks {t['blocks']}, {t['num_tokens']} tokens")
    used = {b: r for b, r in enumerate(state["ref_counts"]) if r}
    lines.append(f"  ref counts {used}")
    lines.append(f"  free list {state['free_list']}")
    return "\n".join(lines)


class BlockTableWidget:
    """A step slider over :func:`replay`; ``html`` shows :func:`state_text`, ``image`` the pool.

    Attributes: ``slider`` (``IntSlider``), ``html`` (``HTML``), ``image`` (``Image``),
    ``widget`` (the ``VBox`` to display), ``states`` and ``state`` (the one shown).
    """

    def __init__(self, events=DEFAULT_WORKLOAD, num_blocks: int = 10, block_size: int = 4):
        self.states = replay(events, num_blocks, block_size)
        self.slider = widgets.IntSlider(value=0, min=0, max=len(self.states) - 1,
                                        description="step", continuous_update=True)
        self.html = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.widget = Panel([self.slider, self.image, self.html], title="Block table",
                            how="move the step slider; block tables, reference counts and "
                                "the free list of a paged KV cache")
        self.slider.observe(lambda change: self.show(change["new"]), names="value")
        self.show(0)

    def show(self, step: int) -> dict:
        """Display state ``step`` (also what moving the slider does); return it."""
        self.state = self.states[step]
        self.text = state_text(self.state)
        self.html.value = ("<pre style='margin:0;font-size:12px'>" + html.escape(self.text)
                           + "</pre>")
        self.image.value = block_pool_png(self.state)
        natural_size(self.image)
        return self.state
