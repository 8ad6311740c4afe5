"""Building the C library: the files of ``csrc/`` compiled into one shared library for this CPU,
as a visible step that is remembered, whether it worked or not.

``python -m llminfra kernels build`` builds it now; otherwise the first use does
(:func:`llminfra.kernels.library.library`), and says so in one line on stderr. The compiler is
``$CC`` where it is set — a ``$CC`` that names no program is a failure, not a reason to take
another — else ``cc``, ``gcc`` or ``clang`` (:func:`find_compiler`). The flags are tuned for
this CPU (``-march=native``; ``-mcpu=native`` on ARM), falling back to portable C where the
compiler refuses them. The build goes into the cache folder (:mod:`llminfra.kernels.cache`) as
``libllminfra_kernels-<key>.so``, the key a hash of everything it depends on: the sources, the
compiler's path, its ``--version`` output, the flags and the CPU. A compile writes a temporary
file named after its process and renames it into place only once it looks like a library, with
its SHA-256 beside it; a cached build is checked before it is loaded and built again when
damaged. A build the compiler refuses leaves a failure marker with the compiler's message:
later calls and processes read it instead of compiling again (``kernels build`` tries again), and
the course takes its torch paths. Chapter 12.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llminfra.kernels.cache import (cache_dir, cached_build_problem, checksum_path,  # noqa: F401
                                    file_problem, forget_failure, library_path, prune,
                                    ours, private_dir, remember_failure, remembered_failure,
                                    remove_orphans, sha256, writable_dir, TMP)

log = logging.getLogger(__name__)

#: the C sources and their header (``llminfra/kernels/csrc/``)
CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "w4a8.c"
#: the worker threads every kernel splits its work over, compiled into the same library
POOL_SOURCE = CSRC / "thread_pool.c"
#: the package's other CPU kernels, compiled into the same library and run on the same pool:
#: fp32 products of one or two rows (``f32_skinny.c``) and of a decode step's rows on W packed
#: in panels (``f32_panels.c``), both :mod:`llminfra.kernels.f32_skinny`; paged decode attention
#: read in place (``paged_decode.c``, :mod:`llminfra.kernels.paged_decode`); a whole decode step
#: in one call (``decode_stack.c``, :mod:`llminfra.runner.decode_stack`)
EXTRA_SOURCES = (CSRC / "f32_skinny.c", CSRC / "f32_panels.c", CSRC / "paged_decode.c",
                 CSRC / "decode_stack.c")
#: the longest a compile may take (a few seconds on 2 cores)
COMPILE_TIMEOUT_S = 300
#: the longest ``$CC --version`` may take
VERSION_TIMEOUT_S = 30
#: what to do without a compiler, in every message that says there is none
INSTALL = ("install one (Debian/Ubuntu: apt install gcc; macOS: xcode-select --install); "
           "until then the course runs its torch paths (PyTorch's int4 kernel "
           "llminfra.quant.int4_linear, oneDNN, SDPA)")


@dataclass(frozen=True)
class Compiler:
    """The C compiler a build runs: ``command`` (the program's path, then the other words of
    ``$CC``) and the first lines of its ``--version`` output."""

    command: tuple[str, ...]
    version: str

    @property
    def path(self) -> str:
        """The compiler program's full path."""
        return self.command[0]


def _version(command: tuple[str, ...]) -> str:
    """The first lines of ``command --version`` ("" where it says nothing)."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True,
                              timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return "\n".join((done.stdout or done.stderr).strip().splitlines()[:3])


def find_compiler() -> Compiler:
    """``$CC`` where it is set (its first word found on ``PATH`` or as a path; ``RuntimeError``
    where it is not a program here), else the first of ``cc``, ``gcc``, ``clang`` on ``PATH``
    (``RuntimeError`` saying how to get one where none is)."""
    cc = os.environ.get("CC")
    if cc:
        try:
            words = shlex.split(cc)
        except ValueError:
            words = []
        found = shutil.which(words[0]) if words else None
        if found is None:
            raise RuntimeError(f"$CC is {cc!r}, which is not a program here: no C compiler to "
                               f"build llminfra/kernels/csrc/ with; point CC at one, or unset "
                               f"it to use cc, gcc or clang, or {INSTALL}")
        command = (found, *words[1:])
        return Compiler(command, _version(command))
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return Compiler((found,), _version((found,)))
    raise RuntimeError(f"no C compiler found ($CC, cc, gcc or clang) to build "
                       f"llminfra/kernels/csrc/ with: {INSTALL}")


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags where Linux says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines()
                 if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _attempts(arch: str) -> list[list[str]]:
    """The flag sets ``arch`` means, tried in turn; ``ValueError`` for one that is not a name."""
    if not isinstance(arch, str) or not arch or not all(c.isalnum() or c in "-_." for c in arch):
        raise ValueError(f"arch must be 'native', 'portable' or a -march value, got {arch!r}")
    if arch == "portable":
        return [[]]
    if arch != "native":
        return [[f"-march={arch}"]]
    machine = platform.machine().lower()
    return [["-mcpu=native"] if machine in ("arm64", "aarch64") else ["-march=native"], []]


def _sources() -> list[Path]:
    """The C files of the library: the named ones, then any other ``csrc/*.c`` (read at call
    time: a test swaps :data:`SOURCE`)."""
    named = [SOURCE, POOL_SOURCE, *EXTRA_SOURCES]
    names = {p.name for p in named}
    return named + sorted(p for p in CSRC.glob("*.c") if p.name not in names)


def _source_bytes() -> bytes:
    """Every C file and header of the library, each with its name and length before it: what
    a build's key hashes (a header changed is another build)."""
    files = _sources() + sorted(CSRC.glob("**/*.h"))
    return b"".join(len(part).to_bytes(8, "little") + part for f in files
                    for part in (f.name.encode(), f.read_bytes()))


def _build_key(source: bytes, command, args: list[str], version: str = "") -> str:
    """What a build depends on, hashed unambiguously (each part's length before it): the
    sources, the compiler's command (a path, or its words), its version, the flags, the CPU."""
    command = (command,) if isinstance(command, str) else tuple(command)
    h = hashlib.sha256()
    for part in (source, *(c.encode() for c in command), b"--args--",
                 *(a.encode() for a in args), b"--version--", version.encode(), b"--cpu--",
                 _cpu_id().encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:16]


def build(arch: str = "native", directory: Path | None = None, retry: bool = False) -> Path:
    """The library built for ``arch`` in ``directory`` (default: the cache folder), compiled
    unless a good build of the same key is there; returns its path. ``arch``: ``"native"``
    (this CPU's vector code, portable C where the compiler refuses it), ``"portable"`` or a
    ``-march`` value such as ``"x86-64-v3"`` (AVX2: the tests build each path so).
    ``RuntimeError`` with the compiler's message where it cannot be built: then, or where a
    failure marker says so from before (``retry=True`` ignores markers and compiles again).
    Where ``directory`` cannot be written a build already there is still used, and a new one
    goes to a private temporary folder (:func:`~llminfra.kernels.cache.writable_dir`)."""
    attempts = _attempts(arch)
    directory = Path(directory) if directory is not None else cache_dir()
    source = _source_bytes()
    try:
        compiler = find_compiler()
    except RuntimeError as e:       # remembered too: `kernels info` shows it
        missing = _build_key(source, ("(no compiler)", os.environ.get("CC", "")), [])
        if remembered_failure(directory, missing) is None:
            remember_failure(directory, missing, str(e))
        raise
    errors, out, compiled = [], None, False
    for flags in attempts:
        args = _args(flags)
        key = _build_key(source, compiler.command, args, compiler.version)
        found, failed = _cached(directory, key, retry)
        if found is None and failed is None:
            out = writable_dir(directory) if out is None else out
            found, failed = _cached(out, key, retry) if out != directory else (None, None)
        if found is not None:
            return found
        if failed is None:
            failed, compiled = _build_into(out, key, compiler, args, not compiled), True
            if failed is None:
                return library_path(out, key)
        errors.append(failed)
    raise RuntimeError(f"could not compile llminfra/kernels/csrc/ with {compiler.path}:\n"
                       + "\n".join(errors))


def _args(flags: list[str]) -> list[str]:
    return ["-O3", "-shared", "-fPIC", "-pthread", *flags]


def cached(arch: str = "native", directory: Path | None = None) -> tuple[Path | None, str]:
    """What :func:`build` would give now without compiling, changing nothing: ``(path, "")``
    of a good build (in ``directory``, default the cache folder, or this user's temporary
    one), else ``(None, why)``: the compiler missing, a remembered failure, or none built."""
    directory = Path(directory) if directory is not None else cache_dir()
    try:
        compiler = find_compiler()
    except RuntimeError as e:
        return None, str(e)
    source, failures = _source_bytes(), []
    for flags in _attempts(arch):
        key = _build_key(source, compiler.command, _args(flags), compiler.version)
        for folder in (directory, *[p for p in (private_dir(),) if ours(p)]):
            path = library_path(folder, key)
            if path.exists() and cached_build_problem(path) is None:
                return path, ""
            failures.append(remembered_failure(folder, key))
    failures = [f for f in failures if f]
    return None, ("\n".join(failures) if failures else
                  f"not built yet in {directory} (python -m llminfra kernels build)")


def _cached(directory: Path, key: str, retry: bool) -> tuple[Path | None, str | None]:
    """``(path, None)`` for a good build of ``key`` in ``directory``; ``(None, message)`` where
    a failure marker is (unless ``retry``); ``(None, None)`` where neither (a damaged build
    removed, where it can be, with a warning)."""
    target = library_path(directory, key)
    if target.exists():
        problem = cached_build_problem(target)
        if problem is None:
            return target, None
        log.warning("llminfra kernels: building again: %s", problem)
        for stale in (target, checksum_path(target)):
            try:
                stale.unlink(missing_ok=True)
            except OSError:
                pass
    failed = None if retry else remembered_failure(directory, key)
    if failed is not None:
        failed += (f" (remembered from an earlier build in {directory}; python -m llminfra "
                   f"kernels build tries again)")
    return None, failed


def _build_into(directory: Path, key: str, compiler: Compiler, args: list[str],
                first: bool) -> str | None:
    """Compile the build of ``key`` into ``directory``: None where it worked (older builds then
    pruned), else the compiler's message, remembered where it will not change by trying again
    (not a timeout). ``first``: the one line on stderr saying what is built, where."""
    target = library_path(directory, key)
    forget_failure(directory, key)
    remove_orphans(directory)
    if first:
        version = compiler.version.splitlines()[0] if compiler.version else "version unknown"
        log.warning("llminfra kernels: compiling %d C files of %s with %s (%s) %s into %s "
                    "(once; python -m llminfra kernels info says more)", len(_sources()), CSRC,
                    compiler.path, version, " ".join(args[4:]) or "as portable C", target)
    error, lasting = _compile(compiler, args, target)
    if error is None:
        prune(directory, target)
        return None
    if lasting:
        remember_failure(directory, key, error)
    return error


def _compile(compiler: Compiler, args: list[str], target: Path) -> tuple[str | None, bool]:
    """Compile into a temporary file of this process, check it, write its checksum and rename
    both into place: ``(None, _)``, or the complaint and whether it lasts (the compiler's
    refusal does; a timeout or an error of this machine's files may not)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{TMP}.{os.getpid()}.", suffix=".tmp",
                               dir=target.parent)
    os.close(fd)
    tmp = Path(tmp)
    tmp_sum = checksum_path(tmp)
    command = " ".join([*compiler.command, *args])
    try:
        done = subprocess.run([*compiler.command, *args, *map(str, _sources()), "-o", str(tmp),
                               "-lm"], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            return f"{command}: {done.stderr.strip()[-500:] or f'exit {done.returncode}'}", True
        problem = file_problem(tmp)
        if problem is not None:
            return f"{command} exited 0 but wrote no library: {problem}", True
        tmp_sum.write_text(sha256(tmp) + "\n")
        os.replace(tmp, target)          # atomic: parallel test workers may race here
        os.replace(tmp_sum, checksum_path(target))
        return None, False
    except subprocess.TimeoutExpired:
        return f"{command}: no result within {COMPILE_TIMEOUT_S} s", False
    except OSError as e:
        return f"{command}: {e}", False
    finally:
        tmp.unlink(missing_ok=True)
        tmp_sum.unlink(missing_ok=True)
