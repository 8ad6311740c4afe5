"""The C library's build as a learner meets it (``llminfra/kernels/build.py``, ``cache.py``,
``abi.py``, ``python -m llminfra kernels``): without a compiler the failure is remembered, said in
one line, never compiled again, and every choice falls back to a torch path; the key holds the
compiler's version; old builds are pruned; a read-only cache or an unwritable home still works;
the ABI is declared in one place; tensors C cannot read are refused by name.

Where a test must not touch the real cache it runs in a fresh one (``LLMINFRA_CACHE``); what
could compile or crash runs in a subprocess. Builds that only test the cache compile a tiny C
file in place of the library's sources (a fraction of a second)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from llminfra.kernels import abi, build, cache

PACKAGE = Path(build.__file__).resolve().parents[1]


def _no_compiler() -> str | None:
    try:
        build.find_compiler()
    except RuntimeError as e:
        return str(e)
    return None


NO_COMPILER = _no_compiler()
needs_cc = pytest.mark.skipif(NO_COMPILER is not None,
                              reason=f"no C compiler here (these tests compile): {NO_COMPILER}")


def run_python(code: str, timeout_s: float = 300, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``env`` over this one's (None: removed)."""
    full = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for k in [k for k, v in env.items() if v is None]:
        full.pop(k, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout_s, env=full)


def fake_cc(tmp_path: Path, body: str) -> Path:
    """A shell script standing in for a compiler; every call appends its arguments to
    ``calls.log`` beside it."""
    script = tmp_path / "fake-cc"
    log = tmp_path / "calls.log"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}\n')
    script.chmod(0o755)
    return script


def compiles(tmp_path: Path) -> list[str]:
    """The fake compiler's calls that were compiles (not ``--version``)."""
    log = tmp_path / "calls.log"
    return [ln for ln in log.read_text().splitlines() if "-shared" in ln] if log.exists() else []


# ---------------------------------------------------------------- no compiler
def test_no_compiler_is_remembered_and_every_choice_falls_back(tmp_path):
    """``CC=/nonexistent``, a fresh cache: ``available()`` False with the reason, said in one
    line on stderr however often it is asked, the failure marker written, the matmul choice a
    torch one, and an engine on the fast runner still generates."""
    cache_dir = tmp_path / "cache"
    r = run_python("""
        import torch
        from llminfra.kernels import library
        from llminfra.runner import kernel_choice, prepacked
        from llminfra.engine import LLMEngine, SamplingParams
        from llminfra.model import load_tiny
        print(library.available(), library.available())
        print(repr(library.unavailable_reason()))
        print(kernel_choice.resolve_matmul("auto", "smollm2-135m"),
              "onednn" if prepacked.available() else "plain")
        m, tok = load_tiny()
        net, runner = kernel_choice.engine_runner(m, "smollm2-135m", runner="fast")
        out = LLMEngine(net, tok, runner=runner).generate(["ab"], SamplingParams(max_tokens=4))
        print(len(out[0].outputs[0].token_ids))
    """, CC="/nonexistent", LLMINFRA_CACHE=str(cache_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "False False"
    assert "$CC is '/nonexistent', which is not a program" in lines[1]
    chosen, want = lines[2].split()
    assert chosen == want
    assert lines[3] == "4"
    said = [ln for ln in r.stderr.splitlines() if "llminfra kernels" in ln]
    assert len(said) == 1 and "pure torch paths" in said[0] and "/nonexistent" in said[0], said
    markers = list(cache_dir.glob("*.failed"))
    assert len(markers) == 1 and "/nonexistent" in markers[0].read_text()


def test_a_failing_compiler_runs_once_across_calls_and_processes(tmp_path):
    """A compiler that refuses: the first process tries each flag set once (native, then
    portable) and remembers; asking again there, or in a second process, compiles nothing
    and says the failure was remembered. ``kernels build`` tries again."""
    cc = fake_cc(tmp_path, 'case "$1" in --version) echo fake-cc 1.0; exit 0;; esac\n'
                           'echo "fake-cc: error: no" >&2\nexit 1')
    env = dict(CC=str(cc), LLMINFRA_CACHE=str(tmp_path / "cache"))
    code = """
        from llminfra.kernels import library
        print(library.available(), library.available(), library.unavailable_reason() is not None)
        print(library.unavailable_reason())
    """
    first = run_python(code, **env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith("False False True") and "fake-cc: error: no" in first.stdout
    assert len(compiles(tmp_path)) == 2                   # -march=native, then portable
    second = run_python(code, **env)
    assert second.returncode == 0 and second.stdout.startswith("False False True")
    assert "remembered" in second.stdout and "fake-cc: error: no" in second.stdout
    assert len(compiles(tmp_path)) == 2                   # nothing compiled again
    assert len(list((tmp_path / "cache").glob("*.failed"))) == 2
    again = subprocess.run([sys.executable, "-m", "llminfra", "kernels", "build"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert again.returncode == 1 and "fake-cc: error: no" in again.stderr
    assert len(compiles(tmp_path)) == 4                   # build: both flag sets once more


def test_kernels_info_without_a_compiler_says_what_runs_instead(tmp_path):
    r = subprocess.run([sys.executable, "-m", "llminfra", "kernels", "info", "--json"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CC": "/nonexistent",
                            "LLMINFRA_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads(r.stdout)
    assert info["loaded"] is False and info["compiler"]["path"] is None
    assert "/nonexistent" in info["compiler"]["error"] and info["cache_dir"] == str(tmp_path)
    assert [k["kernel"] for k in info["kernels"]] == [
        "int4 matmul", "fp32 few-row matmul", "fp32 panel matmul", "paged attention",
        "one-call step"]
    assert all(k["runs"] == k["without_library"] for k in info["kernels"])
    assert list(tmp_path.iterdir()) == []                 # info changes nothing


@needs_cc
def test_kernels_build_then_info(tmp_path):
    env = {**os.environ, "LLMINFRA_CACHE": str(tmp_path)}
    env.pop("CC", None)
    built = subprocess.run([sys.executable, "-m", "llminfra", "kernels", "build"],
                           capture_output=True, text=True, timeout=600, env=env)
    assert built.returncode == 0, built.stderr[-2000:]
    assert "compiling" in built.stderr and str(tmp_path) in built.stderr   # the one line
    path = Path(built.stdout.split()[1])
    assert path.parent == tmp_path and path.name.startswith("libllminfra_kernels-")
    r = subprocess.run([sys.executable, "-m", "llminfra", "kernels", "info", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    info = json.loads(r.stdout)
    assert info["loaded"] is True and info["file"] == str(path)
    assert info["isa"] in abi.PATHS.values() or info["isa"].startswith("neon")
    assert all(k["runs"] != k["without_library"] for k in info["kernels"])


# ---------------------------------------------------------------- the cache
@pytest.fixture
def tiny_sources(tmp_path, monkeypatch):
    """The build's sources swapped for a tiny C file (a build then takes a fraction of a
    second; the cache works the same)."""
    src = tmp_path / "src"
    src.mkdir()
    one, two = src / "w4a8.c", src / "thread_pool.c"
    one.write_text("int tiny_one(int x) { return x + 1; }\n")
    two.write_text("int tiny_two(int x) { return x * 2; }\n")
    for name, value in (("CSRC", src), ("SOURCE", one), ("POOL_SOURCE", two),
                        ("EXTRA_SOURCES", ())):
        monkeypatch.setattr(build, name, value)
    return src


@needs_cc
def test_the_compiler_s_version_is_in_the_key(tmp_path, tiny_sources, monkeypatch):
    """The same compiler path answering ``--version`` differently (an upgrade in place) gives
    another build; the first version again finds its build, compiling nothing."""
    real = build.find_compiler().path
    cc = fake_cc(tmp_path, f'[ "$1" = --version ] && {{ cat {tmp_path}/version; exit 0; }}\n'
                           f'exec {real} "$@"')
    monkeypatch.setenv("CC", str(cc))
    out = tmp_path / "cache"
    paths = []
    for version in ("fake-cc 1.0", "fake-cc 2.0", "fake-cc 1.0"):
        (tmp_path / "version").write_text(version + "\n")
        paths.append(build.build("portable", out))
    assert paths[0] != paths[1] and paths[2] == paths[0]
    assert all(cache.cached_build_problem(p) is None for p in paths)
    assert len(compiles(tmp_path)) == 2
    assert build._build_key(b"x", "/usr/bin/cc", [], "gcc 12") != \
        build._build_key(b"x", "/usr/bin/cc", [], "gcc 13")
    assert build._build_key(b"x", "/usr/bin/cc", [], "") != \
        build._build_key(b"x", "/usr/local/bin/cc", [], "")


@needs_cc
def test_old_builds_are_pruned(tmp_path, tiny_sources):
    """Six builds of other keys, their failure markers and an earlier version's ``w4a8-*``
    files: a new build keeps itself and the newest :data:`KEEP_BUILDS` of each kind."""
    out = tmp_path / "cache"
    out.mkdir()
    old = []
    for age in range(6):
        lib, marker = cache.library_path(out, f"old{age}"), cache.marker_path(out, f"old{age}")
        for f in (lib, cache.checksum_path(lib), marker):
            f.write_text("x")
            os.utime(f, (1e9 - age * 1e6, 1e9 - age * 1e6))      # old0 the newest
        old.append((lib, marker))
    legacy = [out / "w4a8-0123456789abcdef.so", out / "w4a8-0123456789abcdef.so.sha256"]
    for f in legacy:
        f.write_text("x")
    path = build.build("portable", out)
    keep = cache.KEEP_BUILDS
    assert path.exists() and cache.cached_build_problem(path) is None
    assert all(lib.exists() and marker.exists() for lib, marker in old[:keep])
    assert not any(f.exists() for lib, marker in old[keep:]
                   for f in (lib, cache.checksum_path(lib), marker))
    assert not any(f.exists() for f in legacy)


@needs_cc
def test_a_read_only_cache_still_works(tmp_path, tiny_sources, monkeypatch):
    """A cache holding a good build loads it and writes nothing; a cache that cannot be
    written (under a file: refused even to root; read-only where this is not root) builds
    into this user's private temporary folder, and finds it there next time."""
    good = tmp_path / "good"
    path = build.build("portable", good)
    before = sorted((f.name, f.stat().st_mtime_ns) for f in good.iterdir())
    good.chmod(0o555)
    try:
        assert build.build("portable", good) == path
        assert sorted((f.name, f.stat().st_mtime_ns) for f in good.iterdir()) == before
    finally:
        good.chmod(0o755)
    (tmp_path / "a-file").write_text("")
    unwritable = [tmp_path / "a-file" / "cache"]
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o555)
        unwritable.append(tmp_path / "ro")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    for folder in unwritable:
        got = build.build("portable", folder)
        assert got.parent == cache.private_dir() and cache.cached_build_problem(got) is None
        assert build.build("portable", folder) == got
    assert len(list(cache.private_dir().glob("*.so"))) == 1


@needs_cc
def test_an_unwritable_home_still_gets_the_library(tmp_path):
    """No ``$LLMINFRA_CACHE``, a home that cannot be written: the real library builds into the
    private temporary folder and loads."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "tmp").mkdir()
    r = run_python("""
        from llminfra.kernels import library
        print(library.available(), library.library().path)
    """, HOME=str(tmp_path / "a-file" / "home"), LLMINFRA_CACHE=None, XDG_CACHE_HOME=None,
        CC=None, TMPDIR=str(tmp_path / "tmp"))
    assert r.returncode == 0, r.stderr[-2000:]
    ok, where = r.stdout.split()
    assert ok == "True" and Path(where).parent.parent == tmp_path / "tmp", r.stdout
    assert "cannot be written" in r.stderr


# ---------------------------------------------------------------- the ABI
def test_the_abi_is_declared_once():
    """Every function of :data:`abi.FUNCTIONS` is a field of :class:`abi.Library`, the C
    header exports exactly those (and the optional ones), and no other module sets argtypes
    or restype or looks a kernel up by name."""
    fields = set(abi.Library.__dataclass_fields__) - {"path", "cdll"}
    assert fields == set(abi.FUNCTIONS) | set(abi.OPTIONAL_FUNCTIONS)
    header = build.CSRC / "llminfra_kernels.h"
    if header.exists():
        exported = set(re.findall(r"^LLMINFRA_API\b[^;(]*?\b(\w+)\s*\(", header.read_text(),
                                  re.M))
        assert exported == set(abi.FUNCTIONS) | set(abi.OPTIONAL_FUNCTIONS)
    wrong = []
    for f in PACKAGE.rglob("*.py"):
        if f.name == "abi.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("argtypes", "restype"):
                wrong.append(f"{f.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr",
                                                                               "hasattr"):
                name = node.args[1] if len(node.args) > 1 else None
                if isinstance(name, ast.Constant) and name.value in abi.FUNCTIONS:
                    wrong.append(f"{f.relative_to(PACKAGE)}:{node.lineno} {name.value}")
    assert not wrong, wrong
    assert abi.refusal("paged_decode_f32", -4).endswith("a block id of a table outside the "
                                                        "pool)")
    assert "attention: a block id" in abi.ERRORS["w4a8_decode_stack"][-34]


def test_tensors_c_cannot_read_are_refused_by_name():
    """Another device (``meta`` stands for any) or a dtype C would read raw: ``ValueError``
    naming the tensor, before the library is asked for (so without a compiler too)."""
    from llminfra.kernels.f32_skinny import f32_mm
    from llminfra.kernels.paged_decode import paged_attention_c
    from llminfra.kernels.w4a8 import pack, w4a8_mm
    meta = torch.empty(2, 64, device="meta")
    cpu = torch.randn(2, 64)
    w = {"codes": torch.zeros(3, 32, dtype=torch.uint8), "d": torch.zeros(3, 2, dtype=torch.int16),
         "m": torch.zeros(3, 2, dtype=torch.int16), "shape": (3, 64)}
    cases = [
        (lambda: w4a8_mm(meta, w), "x is on meta"),
        (lambda: w4a8_mm(cpu, {**w, "codes": w["codes"].to("meta")}), r"w\['codes'\] is on meta"),
        (lambda: w4a8_mm(cpu, {**w, "d": w["d"].float()}), r"w\['d'\] must be torch.int16"),
        (lambda: pack(torch.zeros(3, 64, dtype=torch.uint8), torch.ones(3, 2, device="meta"),
                      torch.zeros(3, 2)), "scale is on meta"),
        (lambda: f32_mm(meta, torch.randn(3, 64)), "x is on meta"),
        (lambda: f32_mm(cpu, torch.randn(3, 64).double()), "weight must be torch.float32"),
        (lambda: f32_mm(cpu, torch.randn(3, 64), torch.zeros(2, 3, device="meta")),
         "residual is on meta"),
        (lambda: paged_attention_c(torch.empty(1, 2, 8, device="meta"), torch.zeros(2, 4, 1, 8),
                                   torch.zeros(2, 4, 1, 8), torch.zeros(1, 1, dtype=torch.long),
                                   torch.ones(1, dtype=torch.long)), "q is on meta"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
