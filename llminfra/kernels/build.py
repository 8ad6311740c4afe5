"""Building w4a8.c into a shared library, and keeping the builds in a cache that can be trusted.

The C files (``w4a8.c``, its ``thread_pool.c`` and the other kernels of
:data:`EXTRA_SOURCES`) are compiled on first use with the machine's C compiler (``$CC``, else ``cc``,
``gcc`` or ``clang``) for this CPU (``-march=native``) into a cache folder
(``$LLMINFRA_CACHE``, else ``$XDG_CACHE_HOME/llminfra`` or ``~/.cache/llminfra``); nothing is
written into the package. A build's file name is a hash of what it depends on (source,
compiler, flags, CPU). A compile writes a temporary file named after its process and renames it
into place only once it looks like a library, with its SHA-256 written beside it; a cached
file is checked against both before it is loaded (:func:`cached_build_problem`) and built again
when damaged — truncated, scrambled, another library put there — since loading a broken shared
library can kill the interpreter (SIGBUS, SIGILL). Temporary files of builds killed mid-compile
are removed by the next build. Loading is :func:`llminfra.kernels.w4a8.load`. Chapter 08.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: the C sources and their header (``llminfra/kernels/csrc/``)
CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "w4a8.c"
#: the worker threads the kernel splits its rows over, compiled into the same library
POOL_SOURCE = CSRC / "thread_pool.c"
#: the package's other CPU kernels, compiled into the same library and run on the same pool:
#: fp32 products of one or two rows (``f32_skinny.c``) and of a decode step's rows on W packed
#: in panels (``f32_panels.c``), both :mod:`llminfra.kernels.f32_skinny`; paged decode attention
#: read in place (``paged_decode.c``, :mod:`llminfra.runner.fast_step`); an int4 model's whole
#: decode step in one call (``decode_stack.c``, :mod:`llminfra.runner.decode_stack`)
EXTRA_SOURCES = (CSRC / "f32_skinny.c", CSRC / "f32_panels.c", CSRC / "paged_decode.c",
                 CSRC / "decode_stack.c")
#: no shared library of w4a8.c is smaller (an empty or truncated file is refused)
MIN_LIBRARY_BYTES = 4096
#: the first bytes of a shared library: ELF (Linux), Mach-O (macOS, both byte orders and fat)
_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")
#: the longest a compile may take (it takes about a second)
COMPILE_TIMEOUT_S = 300


def cache_dir() -> Path:
    """Where built kernels are kept: ``$LLMINFRA_CACHE``, else ``$XDG_CACHE_HOME/llminfra``,
    else ``~/.cache/llminfra``."""
    if os.environ.get("LLMINFRA_CACHE"):
        return Path(os.environ["LLMINFRA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llminfra"


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise RuntimeError("no C compiler found ($CC, cc, gcc or clang): the w4a8 kernel is built "
                       "from llminfra/kernels/csrc/w4a8.c on first use; install one (Debian/Ubuntu: "
                       "apt install gcc; macOS: xcode-select --install) or use PyTorch's int4 "
                       "kernel (llminfra.quant.int4_linear)")


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags where Linux says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _arch_flags() -> list[list[str]]:
    """Flag sets to try in turn: tuned for this CPU first, then none (the portable path)."""
    machine = platform.machine().lower()
    native = ["-mcpu=native"] if machine in ("arm64", "aarch64") else ["-march=native"]
    return [native, []]


def build(arch: str = "native", directory: Path | None = None) -> Path:
    """Compile ``w4a8.c`` into ``directory`` (default :func:`cache_dir`) unless a build of the
    same source, compiler, flags and CPU is there; returns the shared library's path.
    ``arch``: ``"native"`` (for this CPU, falling back to portable C where the compiler refuses),
    ``"portable"`` (no vector code) or a ``-march`` value such as ``"x86-64-v3"`` (AVX2: the
    tests build each path this way). ``RuntimeError`` with the compiler's message when it cannot
    be built.

    A cached build is used only if it passes :func:`cached_build_problem` (its size, its first
    bytes, and the SHA-256 written beside it when it was built); else it is built again. A
    compile writes a temporary file named after this process and renames it into place only
    once it looks like a library, with its checksum; temporary files of processes that no
    longer run (a build killed mid-compile) are removed."""
    if not isinstance(arch, str) or not arch or not all(c.isalnum() or c in "-_." for c in arch):
        raise ValueError(f"arch must be 'native', 'portable' or a -march value, got {arch!r}")
    if arch == "native":
        attempts = _arch_flags()
    elif arch == "portable":
        attempts = [[]]
    else:
        attempts = [[f"-march={arch}"]]
    cc = _compiler()
    directory = Path(directory) if directory is not None else cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _remove_orphans(directory)
    source = b"".join(len(b).to_bytes(8, "little") + b          # every file, unambiguously
                      for b in (p.read_bytes() for p in _sources()))
    errors = []
    for flags in attempts:
        args = ["-O3", "-shared", "-fPIC", "-pthread", *flags]
        key = _build_key(source, cc, args)
        target = directory / f"w4a8-{key}.so"
        if target.exists():
            problem = cached_build_problem(target)
            if problem is None:
                return target
            log.warning("w4a8: building again: %s", problem)
            for stale in (target, _checksum_path(target)):
                stale.unlink(missing_ok=True)
        error = _compile(cc, args, target)
        if error is None:
            return target
        errors.append(error)
    raise RuntimeError("could not compile llminfra/kernels/csrc/w4a8.c:\n" + "\n".join(errors))


def _sources() -> list[Path]:
    """The C files of the library (read at call time: a test swaps :data:`SOURCE`)."""
    return [SOURCE, POOL_SOURCE, *EXTRA_SOURCES]


def _build_key(source: bytes, cc: str, args: list[str]) -> str:
    """What a build depends on, hashed unambiguously (each part's length before it)."""
    h = hashlib.sha256()
    for part in (source, cc.encode(), *(a.encode() for a in args), b"--cpu--",
                 _cpu_id().encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:16]


def _checksum_path(library_path: Path) -> Path:
    return library_path.with_name(library_path.name + ".sha256")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a shared library of w4a8.c (too small, not a library), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"{path} cannot be read: {e}"
    if size < MIN_LIBRARY_BYTES:
        return f"{path} is {size} bytes, smaller than any build of w4a8.c ({MIN_LIBRARY_BYTES})"
    if head not in _MAGIC:
        return f"{path} is not a shared library (it starts {head!r})"
    return None


def cached_build_problem(path: Path) -> str | None:
    """Why the cached build at ``path`` must not be loaded, or None: it is too small or not a
    shared library, its checksum file (``<name>.sha256``, written when it was built) is
    missing, or the file's SHA-256 is not the one written (truncated, overwritten, another
    library put there)."""
    path = Path(path)
    problem = _file_problem(path)
    if problem is not None:
        return problem
    try:
        want = _checksum_path(path).read_text().strip()
    except OSError:
        return f"{path} has no checksum file beside it ({_checksum_path(path).name})"
    got = _sha256(path)
    if got != want:
        return f"{path}'s SHA-256 is {got[:16]}…, not the {want[:16]}… written when it was built"
    return None


def _compile(cc: str, args: list[str], target: Path) -> str | None:
    """Compile into a temporary file of this process, check it, write its checksum and rename
    both into place; the compiler's complaint (or what is wrong with its output) if not."""
    fd, tmp = tempfile.mkstemp(prefix=f".w4a8.{os.getpid()}.", suffix=".tmp",
                               dir=target.parent)
    os.close(fd)
    tmp = Path(tmp)
    tmp_sum = tmp.with_name(tmp.name + ".sha256")
    command = f"{cc} {' '.join(args)}"
    try:
        done = subprocess.run([cc, *args, *map(str, _sources()), "-o", str(tmp), "-lm"],
                              capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            return f"{command}: {done.stderr.strip()[-500:]}"
        problem = _file_problem(tmp)
        if problem is not None:
            return f"{command} exited 0 but wrote no library: {problem}"
        tmp_sum.write_text(_sha256(tmp) + "\n")
        os.replace(tmp, target)          # atomic: parallel test workers may race here
        os.replace(tmp_sum, _checksum_path(target))
        return None
    except subprocess.TimeoutExpired:
        return f"{command}: no result within {COMPILE_TIMEOUT_S} s"
    except OSError as e:
        return f"{command}: {e}"
    finally:
        tmp.unlink(missing_ok=True)
        tmp_sum.unlink(missing_ok=True)


def _remove_orphans(directory: Path) -> None:
    """Delete the temporary files of builds whose process is gone (killed mid-compile)."""
    for f in directory.glob(".w4a8.*.tmp*"):
        try:
            pid = int(f.name.split(".")[2])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not _alive(pid):
            f.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # another user's process: alive
        return True
    return True
