"""The w4a8 kernel never takes the interpreter down (issue 43): a row wider than its block table
is refused in Python and in C (it used to write past ``nb[MAX_BLOCKS]`` on the AVX2 path), a NaN
in x gives NaN as PyTorch's product does (not finite garbage), and a cached build is checked
before it is loaded — truncated, scrambled, another library in its place, an empty file from a
"compiler" that does nothing, a build killed mid-compile — rebuilt, or refused with the reason.
Whatever could crash runs in a subprocess."""

import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from llminfra.quant import quantize
from llminfra.kernels import w4a8, build as w4a8_build

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not w4a8.available(),
                                 reason=f"the C library does not build here: "
                                        f"{w4a8.unavailable_reason()}")]

X86 = platform.machine().lower() in ("x86_64", "amd64")
ARCHES = ["portable"] + (["x86-64-v3", "native"] if X86 else ["native"])


@pytest.fixture(scope="module", params=ARCHES)
def built(request, tmp_path_factory):
    path = w4a8.build(request.param, tmp_path_factory.mktemp("w4a8"))
    return request.param, path, w4a8.load(path)


def run_python(code: str, timeout_s: float = 120, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (a crash there is a return code here)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, **env})


# ---------------------------------------------------------------- wide rows
def test_a_row_past_the_block_table_is_refused_in_python(built):
    _, _, lib = built
    for K in (w4a8.MAX_K + 64, 262_144 + 64, 512_000):
        with pytest.raises(ValueError, match=f"up to {w4a8.MAX_K}"):
            w4a8.pack(torch.zeros(1, K, dtype=torch.uint8), torch.ones(1, K // 32),
                      torch.zeros(1, K // 32), lib)
        with pytest.raises(ValueError, match=f"up to {w4a8.MAX_K}"):
            w4a8.w4a8_linear()(torch.zeros(1, K))


def test_the_widest_row_allowed_multiplies_right(built):
    """K = MAX_K on every path: the whole block table used, the product still right."""
    _, _, lib = built
    K, gen = w4a8.MAX_K, torch.Generator().manual_seed(0)
    w = w4a8.prepare(quantize(torch.randn(3, K, generator=gen), "int4-g32"), lib)
    x = torch.randint(-127, 128, (2, K), generator=gen).float()
    x[:, ::32] = 127.0                                   # on the int8 grid: exact but for sums
    W = w4a8.dequantize(w, lib).double()
    want, scale = x.double() @ W.T, x.double().abs() @ W.abs().T
    got = w4a8.w4a8_mm(x, w, lib).double()
    # float32 sums of 8,000 group products: within 1e-6 of the sum of the terms' sizes
    assert bool(((got - want).abs() <= 1e-6 * scale).all()), float(((got - want) / scale).max())


def test_the_c_code_refuses_a_wide_row_itself(built):
    """Called directly (no Python guard), ``w4a8_pack`` and ``w4a8_gemm`` return -2 for K past
    MAX_K (262,144 + 64 overflowed the AVX2 block table), not 64-aligned, or <= 0, and
    ``w4a8_gemm`` for passes or threads out of range."""
    _, path, _ = built
    r = run_python(f"""
        import ctypes
        from llminfra.kernels import w4a8
        lib = w4a8.load({str(path)!r})
        out = []
        for K in ({w4a8.MAX_K + 64}, 262208, 512000, 100, 0, -64):
            n = max(K, 64)
            u = (ctypes.c_uint8 * n)(); packed = (ctypes.c_uint8 * n)()
            x = (ctypes.c_float * n)(); y = (ctypes.c_float * 4)()
            d = (ctypes.c_uint16 * n)(); m = (ctypes.c_uint16 * n)()
            out.append(lib.w4a8_pack(u, packed, 1, K))
            out.append(lib.w4a8_gemm(x, packed, d, m, y, 1, 1, K, K, 0, None, 0.0, 1, 2, None))
        out.append(lib.w4a8_gemm(x, packed, d, m, y, 1, 1, 64, 64, 0, None, 0.0, 3, 1, None))
        for threads in (0, -1, 65):
            out.append(lib.w4a8_gemm(x, packed, d, m, y, 1, 1, 64, 64, 0, None, 0.0, 1, threads,
                                     None))
        print(out)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str([-2] * 16)


# ---------------------------------------------------------------- NaN and infinity
@pytest.mark.parametrize("passes", [1, 2])
def test_nan_in_x_gives_nan_like_pytorch(built, passes):
    _, _, lib = built
    gen = torch.Generator().manual_seed(1)
    K = 576
    w = w4a8.prepare(quantize(torch.randn(40, K, generator=gen), "int4-g32"), lib)
    x = torch.randn(4, K, generator=gen)
    clean = w4a8.w4a8_mm(x, w, lib, passes)
    bad = x.clone()
    bad[1, 37] = float("nan")
    bad[2, 500] = float("inf")
    bad[3, 0] = -float("inf")
    got = w4a8.w4a8_mm(bad, w, lib, passes)
    want = bad @ w4a8.dequantize(w, lib).T                   # PyTorch: non-finite rows
    for r in (1, 2, 3):
        assert not torch.isfinite(want[r]).any() and not torch.isfinite(got[r]).any(), r
    assert torch.isnan(got[1]).all()
    torch.testing.assert_close(got[0], clean[0], rtol=0, atol=0)   # other rows untouched


def test_nan_through_the_fused_norm_and_gate(built):
    _, _, lib = built
    f = w4a8.w4a8_linear()(torch.randn(24, 128, generator=torch.Generator().manual_seed(2)))
    x = torch.randn(2, 128)
    x[0, 5] = float("nan")
    assert torch.isnan(f.fused(x, norm=torch.ones(128))[0]).all()
    assert torch.isfinite(f.fused(x, norm=torch.ones(128))[1]).all()
    xg = torch.randn(2, 256)
    xg[1, 200] = float("nan")                                      # in ``up``
    out = f.fused(xg, gated=True)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()


# ---------------------------------------------------------------- the cached build
@pytest.fixture(scope="module")
def portable_build(tmp_path_factory) -> Path:
    """One portable build for the module (a build compiles every C file of the library)."""
    return w4a8.build("portable", tmp_path_factory.mktemp("portable"))


def _fresh(tmp_path, built: Path) -> Path:
    """The module's build and its checksum, copied where ``build("portable", tmp_path)`` puts
    it: a cache holding a good build."""
    for f in (built, built.with_name(built.name + ".sha256")):
        shutil.copyfile(f, tmp_path / f.name)
    path = tmp_path / built.name
    assert w4a8.cached_build_problem(path) is None
    return path


def _load_in_subprocess(directory: Path) -> subprocess.CompletedProcess:
    """build + load + one product in a fresh interpreter, as ``library()`` would."""
    return run_python(f"""
        import torch
        from llminfra.quant import quantize
        from llminfra.kernels import w4a8
        path = w4a8.build("portable", {str(directory)!r})
        lib = w4a8.load(path)
        w = w4a8.prepare(quantize(torch.randn(4, 64), "int4-g32"), lib)
        print("ok", w4a8.w4a8_mm(torch.randn(1, 64), w, lib).shape)
    """)


@pytest.mark.parametrize("damage", ["truncate", "scramble", "empty", "other library",
                                    "no checksum"])
def test_a_damaged_cached_build_is_built_again(tmp_path, damage, portable_build):
    path = _fresh(tmp_path, portable_build)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:len(data) // 3])
    elif damage == "scramble":
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes(b ^ 0xA5 for b in data[mid:mid + 4096])
                         + data[mid + 4096:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other library":
        import _ctypes
        shutil.copyfile(_ctypes.__file__, path)
    else:
        (tmp_path / (path.name + ".sha256")).unlink()
    assert w4a8.cached_build_problem(path) is not None
    with pytest.raises(RuntimeError, match="not loading"):
        w4a8.load(path)                                     # refused before dlopen
    r = _load_in_subprocess(tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]
    assert w4a8.cached_build_problem(path) is None and path.read_bytes() == data


def test_another_library_with_a_matching_checksum_is_refused_by_its_symbols(tmp_path):
    """Someone put another library and its checksum where the build for this CPU goes: in a
    fresh interpreter ``available()`` is False and says what the file lacks; nothing crashes."""
    import _ctypes
    path = w4a8.build(directory=tmp_path)                 # the native build, as library() asks
    shutil.copyfile(_ctypes.__file__, path)
    (tmp_path / (path.name + ".sha256")).write_text(w4a8_build.sha256(path))
    r = run_python("""
        from llminfra.kernels import w4a8
        print(w4a8.available()); print(w4a8.unavailable_reason())
    """, LLMINFRA_CACHE=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    first, reason = r.stdout.split("\n", 1)
    assert first == "False" and "lacks w4a8_gemm" in reason, r.stdout


def test_a_compiler_that_writes_nothing_caches_nothing(tmp_path):
    """``CC=/bin/true`` exits 0 and writes no library: refused with the reason, no library
    cached (only the failure marker, holding the reason), ``available()`` False with it."""
    true = shutil.which("true")
    r = run_python("""
        from llminfra.kernels import w4a8
        print(w4a8.available()); print(w4a8.unavailable_reason())
    """, CC=true, LLMINFRA_CACHE=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    first, reason = r.stdout.split("\n", 1)
    assert first == "False" and "wrote no library" in reason and "0 bytes" in reason
    left = list(tmp_path.iterdir())                        # no library, no temporary file
    assert left and all(f.suffix == ".failed" for f in left), left     # native, portable
    assert all("wrote no library" in f.read_text() for f in left)


def test_a_build_killed_mid_compile_leaves_nothing_for_long(tmp_path):
    """A build SIGKILLed while its compiler runs leaves its temporary file; the next build
    removes it (its process is gone) and builds."""
    slow = tmp_path / "slow-cc"
    slow.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo slow-cc 1; exit 0; }\nsleep 60\n')
    slow.chmod(0o755)
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", "from llminfra.kernels import w4a8; "
                             f"w4a8.build('portable', {str(cache)!r})"],
                            env={**os.environ, "CC": str(slow)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(cache.glob(".llminfra_kernels.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = list(cache.glob(".llminfra_kernels.*.tmp"))
        assert left, "the build never started its compiler"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)               # the build and its "compiler"
        proc.wait(30)
    assert all(f.exists() for f in left)                   # killed: nothing cleaned up
    path = w4a8.build("portable", cache)
    assert not any(f.exists() for f in left)
    assert w4a8.cached_build_problem(path) is None
    assert sorted(f.name for f in cache.iterdir()) == [path.name, path.name + ".sha256"]


def test_the_build_key_is_unambiguous():
    """Flags joined with spaces made ``["-O3 -x"]`` and ``["-O3", "-x"]`` one build."""
    src = b"int x;"
    key = w4a8_build._build_key
    assert key(src, "cc", ["-O3 -x"]) != key(src, "cc", ["-O3", "-x"])
    assert key(src, "c", ["c-O3"]) != key(src, "cc", ["-O3"])
