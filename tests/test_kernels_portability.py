"""The C library (``llminfra/kernels/csrc/``) under one header, and the same bits wherever it is
built: with gcc and with clang, for this x86 CPU and for no vector unit, and for aarch64 (with
ARMv8.2's dot product, the int4 kernel's NEON path, and without it), cross-compiled and run
under qemu-user.

Each build compiles the library as ``llminfra/kernels/build.py`` does (``-O3 -shared -fPIC
-pthread``, with or without ``-march``), with ``-Wall -Wextra`` and no warning allowed, and
links ``tests/csrc/kernels_driver.c`` against it: every kernel on fixed pseudo-random inputs,
one hash of the output bits per case and thread count. Builds of one instruction set must print
the same lines; aarch64's must print the x86 portable build's (the int4 kernel's NEON path
takes the portable loop's float steps; ``csrc/simd.h`` keeps aarch64's FMA out of the portable
loops). A tool that is not installed skips its test with the reason (a skip is not a pass);
with ``LLMINFRA_REQUIRE_PORTABILITY=1`` (CI, ``.ci/run``) it fails it. Chapter 12.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "llminfra" / "kernels" / "csrc"
HEADER = CSRC / "llminfra_kernels.h"
DRIVER = ROOT / "tests" / "csrc" / "kernels_driver.c"
#: build.py's flags, then the warnings no build of the library may print
FLAGS = ["-O3", "-fPIC", "-pthread"]
WARNINGS = ["-Wall", "-Wextra", "-Werror=implicit-function-declaration",
            "-Werror=incompatible-pointer-types"]
SYSROOT = "/usr/aarch64-linux-gnu"
X86 = platform.machine().lower() in ("x86_64", "amd64")
#: (compiler, -march flags) of every build the tests compare
BUILDS = {"gcc-portable": ("gcc", []), "gcc-native": ("gcc", ["-march=native"]),
          "clang-portable": ("clang", []), "clang-native": ("clang", ["-march=native"]),
          "aarch64-dotprod": ("aarch64-linux-gnu-gcc", ["-march=armv8.2-a+dotprod"]),
          "aarch64-v8": ("aarch64-linux-gnu-gcc", ["-march=armv8-a"]),
          # clang's aarch64 code (Apple silicon's compiler), on the cross toolchain's libraries
          "aarch64-clang": ("clang", ["--target=aarch64-linux-gnu", "-march=armv8.2-a+dotprod"])}
TIMEOUT_S = 600


def _missing(what: str) -> None:
    """Skip (not a pass), or fail where LLMINFRA_REQUIRE_PORTABILITY=1 asks for every tool."""
    message = f"{what}: this portability check did not run (not counted as a pass)"
    if os.environ.get("LLMINFRA_REQUIRE_PORTABILITY") == "1":
        pytest.fail(f"{message}; LLMINFRA_REQUIRE_PORTABILITY=1 requires it")
    pytest.skip(message)


def _absent(name: str) -> list[str]:
    """What build ``name`` needs and this machine lacks: its compiler, and for aarch64 the
    cross C library, qemu-user (and for clang, the cross toolchain's libraries)."""
    need = [BUILDS[name][0]]
    if name.startswith("aarch64"):
        need += ["qemu-aarch64"] + (["aarch64-linux-gnu-gcc"] if name == "aarch64-clang" else [])
    absent = [tool for tool in need if not shutil.which(tool)]
    if name.startswith("aarch64") and not Path(SYSROOT, "include", "stdio.h").exists():
        absent.append(f"libc6-dev-arm64-cross ({SYSROOT}/include)")
    return absent


def _build(name: str, directory: Path) -> dict:
    """Compile the library and the driver of build ``name`` into ``directory``: the library's
    path, the compilers' messages and the driver's command (None where a tool is missing)."""
    cc, march = BUILDS[name]
    out = {"name": name, "library": directory / f"libllminfra_kernels-{name}.so",
           "messages": "", "command": None, "error": None}
    if _absent(name):
        out["error"] = "missing"
        return out
    driver = directory / f"kernels_driver-{name}"
    sources = sorted(str(p) for p in CSRC.glob("*.c"))
    steps = [[cc, *FLAGS, *march, *WARNINGS, "-shared", *sources, "-o", str(out["library"]),
              "-lm"],
             [cc, *FLAGS, *march, *WARNINGS, str(DRIVER), str(out["library"]), "-o",
              str(driver), "-lm"]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=TIMEOUT_S)
        out["messages"] += done.stdout + done.stderr
        if done.returncode:
            out["error"] = f"{' '.join(step[:4])} ... failed:\n{done.stderr[-3000:]}"
            return out
    out["command"] = (["qemu-aarch64", "-L", SYSROOT, str(driver)]
                      if name.startswith("aarch64") else [str(driver)])
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict:
    """Every build of BUILDS, compiled side by side (one compiler process per core)."""
    directory = tmp_path_factory.mktemp("kernels_portability")
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as ex:
        done = ex.map(lambda n: _build(n, directory), BUILDS)
    return {b["name"]: b for b in done}


def _get(builds: dict, name: str) -> dict:
    build = builds[name]
    if build["error"] == "missing":
        _missing(f"{', '.join(_absent(name))} not installed (build {name})")
    assert build["error"] is None, build["error"]
    return build


def _run(build: dict) -> dict[str, str]:
    """The driver's lines: case (with its thread count) -> return code and hash."""
    done = subprocess.run(build["command"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{build['name']}'s driver failed: {done.stderr[-2000:]}"
    lines = {}
    for line in done.stdout.splitlines():
        m = re.fullmatch(r"isa (.*)|(.*) (rc=-?\d+ [0-9a-f]{16})", line)
        assert m, f"{build['name']}'s driver printed {line!r}"
        lines["isa" if m.group(1) else m.group(2)] = m.group(1) or m.group(3)
    return lines


def _first_mismatches(a: dict, b: dict, names: tuple[str, str]) -> str:
    cases = [c for c in sorted(set(a) | set(b)) if c != "isa" and a.get(c) != b.get(c)]
    shown = "\n".join(f"  {c}: {names[0]} {a.get(c)}, {names[1]} {b.get(c)}" for c in cases[:5])
    return f"{len(cases)} of {len(a) - 1} cases differ, the first:\n{shown}"


def _assert_same_bits(builds: dict, one: str, other: str, isa: str | None = None) -> None:
    a, b = _run(_get(builds, one)), _run(_get(builds, other))
    if isa is not None:
        assert b["isa"].split()[0] == isa, f"{other} built {b['isa']}, not {isa}"
    cases = {k: v for k, v in a.items() if k != "isa"}
    refused = [k for k, v in cases.items() if not v.startswith("rc=0 ")]
    assert len(cases) > 80 and not refused, refused
    assert {k: v for k, v in b.items() if k != "isa"} == cases, _first_mismatches(
        a, b, (one, other))


@pytest.mark.parametrize("name", list(BUILDS))
def test_every_build_compiles_without_a_warning(builds, name):
    """gcc, clang and the aarch64 cross compiler, -Wall -Wextra: nothing printed at all."""
    build = _get(builds, name)
    assert build["messages"].strip() == "", f"{name}:\n{build['messages'][-3000:]}"


def test_gcc_and_clang_give_the_same_bits_on_the_portable_path(builds):
    _assert_same_bits(builds, "gcc-portable", "clang-portable", isa="portable")


def test_gcc_and_clang_give_the_same_bits_on_the_native_path(builds):
    """Where both compile the same instruction set for this CPU (the int4 kernel's path)."""
    gcc, clang = _run(_get(builds, "gcc-native")), _run(_get(builds, "clang-native"))
    if gcc["isa"] != clang["isa"]:
        pytest.skip(f"gcc built {gcc['isa']}, clang {clang['isa']}: not one path to compare "
                    "(not counted as a pass)")
    _assert_same_bits(builds, "gcc-native", "clang-native")


@pytest.mark.parametrize("name,isa", [("aarch64-dotprod", "neon-dotprod"),
                                      ("aarch64-v8", "portable"),
                                      ("aarch64-clang", "neon-dotprod")])
def test_aarch64_under_qemu_gives_the_x86_portable_bits(builds, name, isa):
    """The NEON dot-product path (vdotq_s32; gcc's and clang's) and ARMv8-A's portable loops,
    run under qemu: every case the x86 portable build's bits."""
    if not X86:
        _missing(f"an x86-64 host to compare aarch64 with (this is {platform.machine()})")
    _assert_same_bits(builds, "gcc-portable", name, isa=isa)


@pytest.mark.parametrize("name", ["gcc-portable", "gcc-native"])
def test_every_thread_count_gives_one_threads_bits(builds, name):
    lines = _run(_get(builds, name))
    by_case = {}
    for case, value in lines.items():
        by_case.setdefault(re.sub(r" threads=\d+", "", case), set()).add(value)
    split = [c for c, values in by_case.items() if len(values) != 1]
    assert len(by_case) > 30 and not split, split


# ---- one header: every exported function declared once, in it --------------------------------

def _code(text: str) -> str:
    """C source without its comments, string literals and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.M | re.S)


def _top_level(text: str) -> list[str]:
    """The file-scope statements of C source: declarations up to their ';', definitions up to
    their body's '{' (the body itself left out)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                out.append(text[start:i] + "{")
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                start = i + 1
        elif ch == ";" and depth == 0:
            out.append(text[start:i + 1])
            start = i + 1
    return [" ".join(s.split()) for s in out if s.strip()]


_FUNCTION = re.compile(r"(?:^|[\s*])(\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:__attribute__.*)?[;{]$")


#: what starts a statement that declares nothing another file sees
PRIVATE = ("static", "LLMINFRA_INLINE", "typedef", "struct", "enum")


def prototypes(text: str) -> list[str]:
    """Names of the functions ``text`` declares without defining (at file scope, not static,
    not a typedef): the prototypes that belong in the header."""
    names = []
    for statement in _top_level(_code(text)):
        m = _FUNCTION.search(statement)
        if (m and statement.endswith(";") and not statement.startswith(PRIVATE)
                and "=" not in statement):
            names.append(m.group(1))
    return names


def definitions(text: str) -> list[str]:
    """Names of the functions ``text`` defines with external linkage (not static)."""
    return [m.group(1) for s in _top_level(_code(text))
            if s.endswith("{") and not s.startswith(PRIVATE)
            and (m := _FUNCTION.search(s))]


def _header_names(kind: str) -> list[str]:
    return re.findall(kind + r"\s[^;]*?\b(\w+)\s*\(", _code(HEADER.read_text()))


def shared_types(text: str) -> list[str]:
    """The header's shared types (``pool_fn``, the ``stack_*`` structs) ``text`` defines."""
    code = _code(text)
    return (re.findall(r"\(\s*\*\s*(pool_fn)\s*\)", code)
            + re.findall(r"struct\s*\{[^}]*\}\s*(stack_\w+)\s*;", code))


def test_no_c_file_declares_a_prototype_of_its_own():
    """A prototype written twice drifts (decode_stack.c once repeated five kernels' signatures):
    every declaration is the header's; the .c files include it and only define."""
    found = {p.name: prototypes(p.read_text()) for p in sorted(CSRC.glob("*.c"))}
    assert len(found) == 6 and not any(found.values()), found
    types = {p.name: shared_types(p.read_text()) for p in sorted(CSRC.glob("*.c"))}
    assert not any(types.values()), f"a shared type defined again: {types}"
    assert sorted(shared_types(HEADER.read_text())) == ["pool_fn", "stack_layer", "stack_model",
                                                        "stack_weight"]


def test_the_prototype_rule_sees_a_prototype():
    src = ("/* int f(int); */\nstatic int g(int x);\ntypedef void (*fn)(int);\n"
           "int w4a8_gemm(const float *x,\n  int n);\nvoid pool_for(int t, void (*f)(int));\n"
           "int h(void) { int k(int); return 0; }\nint table[2] = {1, 2};\n"
           "#define M(x) int m(x);\nLLMINFRA_INLINE float s(const v16 *v) { return 0; }\n")
    assert prototypes(src) == ["w4a8_gemm", "pool_for"]
    assert definitions(src) == ["h"]
    types = "typedef void (*pool_fn)(void *, int, int);\ntypedef struct { int N; } stack_weight;"
    assert shared_types(types) == ["pool_fn", "stack_weight"]
    assert shared_types("typedef struct { pool_fn fn; } job_t;") == []


def test_every_c_file_includes_the_header_first():
    """simd.h first (its float rules must hold for everything after), then the header."""
    for path in sorted(CSRC.glob("*.c")):
        includes = re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', path.read_text(), re.M)
        assert includes[:2] == ["simd.h", "llminfra_kernels.h"], (path.name, includes[:3])


def test_every_function_is_declared_once_and_defined_once():
    api, internal = _header_names("LLMINFRA_API"), _header_names("LLMINFRA_INTERNAL")
    declared = api + internal
    assert len(declared) == len(set(declared)) and len(api) >= 15, declared
    defined = [n for p in sorted(CSRC.glob("*.c")) for n in definitions(p.read_text())]
    assert sorted(defined) == sorted(declared), (sorted(set(defined) ^ set(declared)))


def test_the_library_exports_exactly_what_the_header_declares(builds):
    """``nm -D`` of the gcc build: every exported function is an LLMINFRA_API of the header, and
    every one of those is exported (the shared internals, LLMINFRA_INTERNAL, are not)."""
    build = _get(builds, "gcc-portable")
    if not shutil.which("nm"):
        _missing("nm (binutils) not installed")
    done = subprocess.run(["nm", "-D", "--defined-only", str(build["library"])],
                          capture_output=True, text=True, timeout=60, check=True)
    exported = {line.split()[-1] for line in done.stdout.splitlines()
                if line.split()[1:2] == ["T"]}
    assert exported == set(_header_names("LLMINFRA_API")), exported ^ set(
        _header_names("LLMINFRA_API"))
    assert not exported & set(_header_names("LLMINFRA_INTERNAL"))
