"""The fast path's kernels are typed, never found: no module of ``llminfra/runner/`` calls
``getattr`` or ``hasattr`` — what a matmul, an attention kernel or a whole-step kernel can do is
a field of its class or of the :class:`~llminfra.runner.kernel_set.KernelSet` (``fuses``,
``adds_in_fused``, ``arena``, ``rope_write``, ``step``), not an attribute probed for. Two
exceptions: a probe of PyTorch itself (``hasattr(torch.ops.mkldnn, ...)``: which ops a build of
PyTorch ships is the build's, not ours), and Python's own dunders (``getattr(f, "__name__",
...)``: any callable's name, no kernel's field). And the fast layer is written once: the fast step
and the fast decoder both call :func:`llminfra.runner.fast_layer.layer`, and neither multiplies
by a layer's weights itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "llminfra" / "runner"
PROBES = {"getattr", "hasattr"}


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts at (``torch`` of ``torch.ops.mkldnn``), else None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dunder(node: ast.Call) -> bool:
    """Whether the attribute asked for is a literal ``__dunder__`` name."""
    name = node.args[1] if len(node.args) > 1 else None
    return (isinstance(name, ast.Constant) and isinstance(name.value, str)
            and name.value.startswith("__") and name.value.endswith("__"))


def probes(source: str) -> list[str]:
    """``line: call`` of every ``getattr`` / ``hasattr`` call in ``source`` but those on an
    object rooted at ``torch`` and those asking for a dunder."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in PROBES and node.args and _root(node.args[0]) != "torch" \
                and not _dunder(node):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_detector_sees_a_probe_and_passes_a_torch_one():
    assert probes("rope = getattr(c_kernel, 'rope_write', None)") == [
        "1: getattr(c_kernel, 'rope_write', None)"]
    assert probes("if hasattr(f, 'fused'):\n    pass") == ["1: hasattr(f, 'fused')"]
    assert probes("x = getattr(getattr(m, 'f', None), 'weight', None)") != []
    assert probes("ok = hasattr(torch.ops.mkldnn, '_linear_pointwise')") == []
    assert probes("y = m.fuses and k.rope_write is not None") == []
    assert probes("name = getattr(fn, '__name__', str(fn))") == []
    assert probes("k = getattr(layer, name)") == ["1: getattr(layer, name)"]


MODULES = sorted(RUNNER.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_kernel_is_found_by_getattr_or_hasattr(path):
    found = probes(path.read_text(encoding="utf-8"))
    assert not found, (f"{path.name} probes for attributes (use a typed field, a base class "
                       f"flag or isinstance instead): {found}")


def _calls(path: Path) -> set[str]:
    """The dotted names a module calls (``fast_layer.layer``, ``F.linear``, ...)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            out.add(ast.unparse(node.func))
    return out


@pytest.mark.parametrize("client", ["fast_step.py", "fast_decode.py"])
def test_the_fast_layer_is_written_once(client):
    calls = _calls(RUNNER / client)
    assert "fast_layer.layer" in calls and "fast_layer.logits" in calls, sorted(calls)
    mine = {c for c in calls if c.startswith(("L.", "layer.")) or ".w13" in c or ".w2" in c
            or ".wqkv" in c or ".wo" in c}
    assert not mine, f"{client} applies a layer's weights itself: {sorted(mine)}"
