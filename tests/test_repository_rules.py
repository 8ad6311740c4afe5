"""The package's shape, checked: dependencies point one way (the layering of DESIGN.md §2), no
two modules import each other (directly or round a circle), the engine knows no HTTP, no module
or function outgrows what a reader takes in at once (350 and 60 lines), no side doors into the
cache or the scheduler's queues, every field of a Sequence has one writer, and every import of
the package inside a function is on a list that says why.

Every ``import`` counts, at module level or inside a function: a function-level import hides a
dependency from the top of the file, it does not remove it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llminfra"

#: what each lower package may import from the rest of llminfra (its own modules aside). The
#: top layer (widgets, plots, bench, course, the command line) may import anything; nothing
#: listed here may import the top layer.
ALLOWED = {
    "validate": set(),                        # leaf guards (llminfra/validate.py), used by all
    "specs": {"validate"},
    "calc": {"validate", "specs"},
    "attention": {"validate"},                # a leaf: every attention the model runs
    "model": {"validate", "attention", "specs"},
    "kvcache": {"validate", "attention", "model", "specs", "calc"},
    "quant": {"validate", "attention", "model", "specs", "calc"},
    "parallel": {"validate", "attention", "model", "specs", "calc"},
    "engine": {"validate", "attention", "model", "kvcache", "specs", "calc"},
    # the fast path, applied to the engine from outside (chapter 12): the C library and its
    # Python face, then the runner on top of both
    "kernels": {"validate", "attention", "model", "quant", "specs", "calc"},
    "runner": {"validate", "attention", "model", "kvcache", "quant", "specs", "calc", "engine",
               "kernels"},
    "sim": {"validate", "attention", "model", "kvcache", "specs", "calc", "engine"},
    "serving": {"validate", "engine", "runner", "kernels", "sim", "model", "kvcache", "quant",
                "parallel", "specs", "calc"},
    "cluster": {"validate", "engine", "sim", "serving", "model", "kvcache", "quant", "parallel",
                "specs", "calc"},
    "ledger": {"validate", "attention", "calc", "kvcache", "model", "parallel", "quant", "engine",
               "specs"},
    "planning": {"validate", "calc", "engine", "sim", "kvcache", "model", "parallel", "quant",
                 "specs"},
}
TOP = {"widgets", "plots", "bench", "course", "cli", "cli_serving", "cli_numbers", "__main__",
       "__init__", "data"}
#: libraries of the web layer: only llminfra.serving (and the top layer) may use them
HTTP = {"fastapi", "uvicorn", "starlette", "httpx", "pydantic", "prometheus_client"}
MAX_LINES = 350


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute; ``from pkg import mod`` resolved to the
    submodule where there is one)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_rules_see_every_package():
    """A package added later gets a line in ALLOWED (or joins the top layer) before it lands."""
    layers = {_layer(m) for m in MODULES}
    assert layers - set(ALLOWED) - TOP == set()
    assert {"engine", "serving", "model", "kvcache"} <= layers


def _upward(imports: dict[str, set[str]], layer: str) -> list[str]:
    return sorted(f"{m} imports {dep}" for m, deps in imports.items() if _layer(m) == layer
                  for dep in deps if dep.startswith("llminfra.") and _layer(dep) != layer
                  and _layer(dep) not in ALLOWED[layer])


def _http(imports: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {dep}" for m, deps in imports.items()
                  if _layer(m) in set(ALLOWED) - {"serving"}
                  for dep in deps if dep.split(".")[0] in HTTP)


def _circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other through their imports (Tarjan's strongly
    connected components of the import graph, those of more than one module)."""
    graph = {m: {d for d in deps if d in imports and d != m} for m, deps in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_dependencies_point_down(layer):
    wrong = _upward(IMPORTS, layer)
    assert not wrong, f"llminfra.{layer} may import only {sorted(ALLOWED[layer])}:\n" + \
        "\n".join(wrong)


#: the packages a learner reads as the engine (chapters 01-05): none of them may reach the fast
#: path, which is handed in from outside (``LLMEngine(runner=llminfra.runner.fast_runner())``)
TEACHING_PATH = ("engine", "model", "kvcache", "attention")
FAST_PATH = ("runner", "kernels")


def test_the_teaching_path_imports_no_fast_path():
    """Statically (every import of the teaching packages' modules) and as it runs: importing
    the engine and running a step loads no module of ``llminfra.runner`` or
    ``llminfra.kernels``."""
    wrong = [f"{m} imports {dep}" for m, deps in IMPORTS.items() if _layer(m) in TEACHING_PATH
             for dep in sorted(deps)
             if dep.startswith("llminfra.") and _layer(dep) in FAST_PATH]
    assert not wrong, "the teaching path reaches the fast path:\n" + "\n".join(wrong)
    import subprocess
    import sys
    code = ("import sys\nfrom llminfra.engine import LLMEngine, SamplingParams\n"
            "from llminfra.model import load_tiny\nm, t = load_tiny()\n"
            "LLMEngine(m, t).generate(['ab'], SamplingParams(max_tokens=2))\n"
            "print(sorted(n for n in sys.modules if n.startswith(('llminfra.runner', "
            "'llminfra.kernels'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_engine_knows_no_http():
    wrong = _http(IMPORTS)
    assert not wrong, "only llminfra.serving speaks HTTP:\n" + "\n".join(wrong)


def test_no_import_circles():
    circles = _circles(IMPORTS)
    assert not circles, "modules that import each other: " + "; ".join(map(str, circles))


def test_modules_stay_readable():
    long = {m: n for m, p in MODULES.items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def test_the_checks_can_fail():
    """On a made-up graph, each rule sees its breach: the model importing the engine, the
    engine importing FastAPI, and a circle of three modules."""
    made_up = {"llminfra.model.x": {"llminfra.engine.y", "torch"},
               "llminfra.engine.y": {"fastapi", "llminfra.model.x"},
               "llminfra.quant.a": {"llminfra.quant.b"}, "llminfra.quant.b": {"llminfra.quant.c"},
               "llminfra.quant.c": {"llminfra.quant.a"}}
    assert _upward(made_up, "model") == ["llminfra.model.x imports llminfra.engine.y"]
    assert _upward(made_up, "engine") == []
    # the shared guards stay a leaf: llminfra.validate importing anything of llminfra is a breach
    assert _upward({"llminfra.validate": {"llminfra.specs.models"}}, "validate") == \
        ["llminfra.validate imports llminfra.specs.models"]
    assert "validate" in ALLOWED["specs"] and "validate" in ALLOWED["attention"]
    assert _http(made_up) == ["llminfra.engine.y imports fastapi"]
    assert _circles(made_up) == [["llminfra.engine.y", "llminfra.model.x"],
                                 ["llminfra.quant.a", "llminfra.quant.b", "llminfra.quant.c"]]
    # and the real graph is read: the engine imports its sequences, the server FastAPI
    assert "llminfra.engine.sequence" in IMPORTS["llminfra.engine.engine"]
    assert "fastapi" in {d.split(".")[0] for d in IMPORTS["llminfra.serving.server"]}


#: the cache's insides (its pool tensors, block tables, reference counts) and the scheduler's
#: queues: read and written through their owners' verbs only (``read_kv`` / ``write_kv`` /
#: ``gather_blocks``, ``block_table``, ``last_block_shared``; ``Scheduler.add`` / ``adopt`` /
#: ``abort``) — no side doors from the rest of the engine
CACHE_INSIDES = re.compile(r"\bcache\.(k|v|store|tables)\b|\.allocator\.ref_count\b")
QUEUE_WRITES = re.compile(r"\bscheduler\.(waiting|running|swapped)\s*(\.(append|appendleft|"
                          r"remove|pop|popleft|clear|extend|insert)\b|=[^=]|\[)")


def test_no_side_doors_into_the_cache_or_the_scheduler_s_queues():
    offenders = []
    for name, path in MODULES.items():
        if not name.startswith(("llminfra.engine", "llminfra.sim", "llminfra.cluster",
                                "llminfra.serving")):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if CACHE_INSIDES.search(code) or QUEUE_WRITES.search(code):
                offenders.append(f"{name}:{i}: {line.strip()}")
    assert not offenders, "use the cache's and the scheduler's verbs:\n" + "\n".join(offenders)


def test_the_side_door_rule_sees_a_side_door():
    assert CACHE_INSIDES.search("k = engine.cache.k[:, blocks]")
    assert CACHE_INSIDES.search("shared = s.cache.allocator.ref_count(b) > 1")
    assert QUEUE_WRITES.search("engine.scheduler.running.append(seq)")
    assert QUEUE_WRITES.search("engine.scheduler.waiting.remove(seq)")
    assert not QUEUE_WRITES.search("n = len(engine.scheduler.running)")
    assert not CACHE_INSIDES.search("kv = engine.cache.read_kv(seq, n)")


# ------------------------------------------------------------------ short functions
#: a function longer than this hides a second one (STYLE.md: "a function longer than about 40
#: lines usually hides a second function"); counted from ``def`` to its last line
MAX_FUNCTION_LINES = 60


def _long_functions(tree: ast.AST, where: str) -> list[str]:
    return [f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_functions_stay_short():
    long = [hit for name, path in MODULES.items()
            for hit in _long_functions(ast.parse(path.read_text(encoding="utf-8")),
                                       str(path.relative_to(PACKAGE.parent)))]
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (each hides a second "
                      "function):\n" + "\n".join(long))


def test_the_function_rule_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _long_functions(ast.parse(f"def f():\n{body}\n"), "m.py") == \
        [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert _long_functions(ast.parse("def g():\n    return 1\n"), "m.py") == []


# ------------------------------------------------------------ one writer a field
#: who writes each field of :class:`llminfra.engine.sequence.Sequence` once it exists: the
#: scheduler (deciding a step in ``scheduler``, writing its result in ``scheduler_update``),
#: through the sequence's own verbs (``set_status``, ``append_output``) where it has them; the
#: stop rules (``check_stop``, beside ``update_from_output``) write the text a stop string cut. Fields absent here are set when the sequence
#: is built and never written again.
SCHEDULER = {"llminfra.engine.scheduler", "llminfra.engine.scheduler_update"}
SEQUENCE_WRITERS = {
    "status": {"llminfra.engine.sequence"},               # Sequence.set_status
    "output_token_ids": {"llminfra.engine.sequence"},     # Sequence.append_output
    "detok": {"llminfra.engine.sequence"},                # Sequence.append_output
    "num_computed_tokens": SCHEDULER, "cache_seq": SCHEDULER, "swapped": SCHEDULER,
    "spec_token_ids": SCHEDULER, "output_logprobs": SCHEDULER,
    "stop_text": {"llminfra.engine.scheduler_update"},   # check_stop
}
#: the sequence's verbs that write its fields, and who may call them
SEQUENCE_VERBS = {"set_status": SCHEDULER, "append_output": SCHEDULER}
SEQUENCE_FIELDS = {"seq_id", "request", "index", "prompt_token_ids", "max_tokens", "generator",
                   "grammar", *SEQUENCE_WRITERS}
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"}


def _sequence_writes(tree: ast.AST, module: str) -> list[str]:
    """``module:line what`` for every write of a Sequence field (an assignment, augmented or
    not, a ``del``, an item assignment or a mutating call on a list field) or call of a
    writing verb outside the field's writers. ``self.<field>`` counts only in the sequence's
    own module (elsewhere ``self`` is another class: the scheduler's ``swapped`` queue)."""
    found = []

    def check(node: ast.AST, attr: ast.Attribute, what: str, allowed: set[str]) -> None:
        is_self = isinstance(attr.value, ast.Name) and attr.value.id == "self"
        if module not in allowed and (not is_self or module == "llminfra.engine.sequence"):
            found.append(f"{module}:{node.lineno} {what} {ast.unparse(attr)}")

    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for t in ast.walk(target):              # the stored names, not those read in them
                if isinstance(t, ast.Subscript) and isinstance(t.ctx, (ast.Store, ast.Del)):
                    t = t.value                     # seq.field[i] = …: a write of the field
                elif not isinstance(getattr(t, "ctx", None), (ast.Store, ast.Del)):
                    continue
                if isinstance(t, ast.Attribute) and t.attr in SEQUENCE_FIELDS:
                    check(node, t, "writes", SEQUENCE_WRITERS.get(t.attr, set()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if node.func.attr in MUTATORS and isinstance(owner, ast.Attribute) \
                    and owner.attr in SEQUENCE_FIELDS:
                check(node, owner, f"{node.func.attr}s", SEQUENCE_WRITERS.get(owner.attr, set()))
            elif node.func.attr in SEQUENCE_VERBS:
                check(node, node.func, "calls", SEQUENCE_VERBS[node.func.attr])
    return found


def test_every_sequence_field_has_one_writer():
    writers = [hit for name, path in MODULES.items()
               for hit in _sequence_writes(ast.parse(path.read_text(encoding="utf-8")), name)]
    assert not writers, ("a Sequence field written outside its writer (ask the scheduler's "
                         "verbs: start, adopt, set_drafts, finish, abort, update_from_output):\n"
                         + "\n".join(writers))


def test_the_writer_rule_sees_a_writer():
    code = ("seq.num_computed_tokens += 1\nseq.cache_seq, n = 3, 4\nseq.spec_token_ids[:] = []\n"
            "seq.output_logprobs.append(x)\nseq.set_status(s)\nself.swapped = deque()\n"
            "n = seq.num_computed_tokens\nlen(seq.output_token_ids)\n")
    assert _sequence_writes(ast.parse(code), "llminfra.engine.x") == [
        "llminfra.engine.x:1 writes seq.num_computed_tokens",
        "llminfra.engine.x:2 writes seq.cache_seq",
        "llminfra.engine.x:3 writes seq.spec_token_ids",
        "llminfra.engine.x:4 appends seq.output_logprobs",
        "llminfra.engine.x:5 calls seq.set_status"]
    assert _sequence_writes(ast.parse(code), "llminfra.engine.scheduler") == []


# ------------------------------------------------------------------ lazy imports
#: every import of the package inside a function, by importing module, and why it waits
#: (everything else is imported at the top, where a reader sees it)
_CLI = "the command line starts in a tenth of a second: a command loads what it runs"
_TRITON = "Triton kernels load only where Triton is installed and the step asks for them"
_WEB = "FastAPI / uvicorn load only where a server is started"
_LLGUIDANCE = "llguidance loads only for a request with a response_format schema"
_NO_TORCH = "the load generator runs without torch (it can test any OpenAI endpoint)"
_SPAWN = "a spawned rank imports torch.distributed itself; the parent stays light"
_SERVE = ("serve builds the engine in its own process: the web process loads no model, the "
          "engine process no web framework")
_HARNESS = ("the comparison harness starts servers and peers first; each measurement imports "
            "what it runs (llama.cpp, the real model, the load generator) when it runs")
LAZY_IMPORTS = {
    "llminfra.cli": ({"llminfra.bench", "llminfra.bench.gpu", "llminfra.calc",
                      "llminfra.calc.params", "llminfra.calc.step", "llminfra.kernels.cli",
                      "llminfra.specs.models"}, _CLI),
    "llminfra.cli_serving": ({"llminfra.serving.loadtest", "llminfra.serving.serve"}, _CLI),
    "llminfra.attention.ragged": ({"llminfra.attention.paged_triton"}, _TRITON),
    "llminfra.runner.fast_step": ({"llminfra.attention.paged_triton"}, _TRITON),
    "llminfra.bench.kvcache": ({"llminfra.attention.paged_triton"}, _TRITON),
    "llminfra.engine.engine": ({"llminfra.engine.structured"}, _LLGUIDANCE),
    "llminfra.serving.relay": ({"llminfra.engine.structured"}, _LLGUIDANCE),
    "llminfra.bench.serving_http": ({"llminfra.serving.background", "llminfra.serving.loadtest",
                                     "llminfra.serving.server"}, _WEB),
    "llminfra.serving.loadtest_workload": ({"llminfra.model"}, _NO_TORCH),
    "llminfra.parallel.launch": ({"llminfra.parallel.distributed_world"}, _SPAWN),
    "llminfra.parallel.workers": ({"llminfra.parallel.dtensor_check"}, _SPAWN),
    "llminfra.serving.serve": ({"llminfra.engine", "llminfra.model", "llminfra.runner",
                                "llminfra.runner.kernel_choice", "llminfra.quant",
                                "llminfra.serving.engine_process",
                                "llminfra.serving.server"}, _SERVE),
    "llminfra.bench.compare_engines": ({"llminfra.bench", "llminfra.bench.real",
                                        "llminfra.bench.real_decode", "llminfra.bench.roofline",
                                        "llminfra.bench.timing", "llminfra.model",
                                        "llminfra.model.hf_export", "llminfra.serving.loadtest",
                                        "llminfra.sim.workload"}, _HARNESS),
    "llminfra.bench.llamacpp": ({"llminfra.bench.real_decode", "llminfra.bench.timing",
                                 "llminfra.calc.measured"}, _HARNESS),
}


def _lazy_imports(tree: ast.AST, module: str, is_package: bool = False) -> set[str]:
    """The package modules ``module`` imports inside its functions (relative ones resolved)."""
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "llminfra"}
            elif isinstance(node, ast.ImportFrom) and node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                found.add(".".join(pkg + ([node.module] if node.module else [])))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == \
                    "llminfra":
                found.add(node.module)
    return found


def test_every_lazy_import_has_a_reason():
    wrong = []
    for name, path in MODULES.items():
        found = _lazy_imports(ast.parse(path.read_text(encoding="utf-8")), name,
                              path.name == "__init__.py")
        allowed = LAZY_IMPORTS.get(name, (set(), ""))[0]
        wrong += [f"{name} imports {dep} inside a function" for dep in sorted(found - allowed)]
    assert not wrong, ("import these at the top, or add them to LAZY_IMPORTS with the reason "
                       "they wait:\n" + "\n".join(wrong))


def test_the_lazy_import_list_is_current():
    """An entry whose import moved to the top (or went) leaves the list too."""
    stale = []
    for name, (deps, _) in LAZY_IMPORTS.items():
        path = MODULES.get(name)
        found = set() if path is None else _lazy_imports(
            ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py")
        stale += [f"{name}: {dep}" for dep in sorted(deps - found)]
    assert not stale, "LAZY_IMPORTS names imports that are no longer lazy:\n" + "\n".join(stale)


def test_the_lazy_import_rule_sees_a_lazy_import():
    code = ("import torch\nfrom llminfra.model import load_tiny\n"
            "def f():\n    import triton\n    from llminfra.engine import LLMEngine\n"
            "    from .paged import x\n    import llminfra.calc\n")
    assert _lazy_imports(ast.parse(code), "llminfra.attention.ragged") == {
        "llminfra.engine", "llminfra.attention.paged", "llminfra.calc"}
