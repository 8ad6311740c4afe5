"""Where the C library's builds are kept, and how a cached file is trusted.

The folder is ``$LLMINFRA_CACHE``, else ``$XDG_CACHE_HOME/llminfra``, else
``~/.cache/llminfra`` (:func:`cache_dir`); nothing is written into the package. Each build is
``libllminfra_kernels-<key>.so``, the key a hash of what it depends on
(:func:`llminfra.kernels.build.build`), with its SHA-256 beside it (``.sha256``); a build that
failed leaves ``libllminfra_kernels-<key>.failed`` holding the compiler's message instead, so
that no later call or process compiles the same thing again (:func:`remembered_failure`).
A cached file is loaded only once :func:`cached_build_problem` finds nothing wrong with it:
loading a broken shared library can kill the interpreter (SIGBUS, SIGILL). Only the newest
:data:`KEEP_BUILDS` builds stay (:func:`prune`). Where the folder cannot be written (read-only,
an unwritable home) a build already there is still loaded, and a new one goes to a private
folder under the system's temporary folder (:func:`writable_dir`). Chapter 12.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: a build's file name: ``PREFIX + key + SUFFIX`` (``FAILED``: the marker of a failed one)
PREFIX, SUFFIX, FAILED = "libllminfra_kernels-", ".so", ".failed"
#: files of earlier versions of the package in the same folder (one kernel's name), pruned
LEGACY_GLOB = "w4a8-*.so*"
#: the builds of other keys kept in a folder (newest first): a CPU's native, AVX2 and
#: portable builds of the current sources, and one older
KEEP_BUILDS = 4
#: no build of the library is smaller (an empty or truncated file is refused)
MIN_LIBRARY_BYTES = 4096
#: the first bytes of a shared library: ELF (Linux), Mach-O (macOS, both byte orders and fat)
_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")
#: the prefix of a compile's temporary files (``.<TMP>.<pid>.…tmp``)
TMP = "llminfra_kernels"


def cache_dir() -> Path:
    """Where built kernels are kept: ``$LLMINFRA_CACHE``, else ``$XDG_CACHE_HOME/llminfra``,
    else ``~/.cache/llminfra`` (the temporary folder's where there is no home)."""
    if os.environ.get("LLMINFRA_CACHE"):
        return Path(os.environ["LLMINFRA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except RuntimeError:                  # no $HOME and no password entry
            base = Path(tempfile.gettempdir())
    return Path(base) / "llminfra"


def library_path(directory: Path, key: str) -> Path:
    """The build of ``key`` in ``directory``."""
    return Path(directory) / f"{PREFIX}{key}{SUFFIX}"


def marker_path(directory: Path, key: str) -> Path:
    """The file that says the build of ``key`` failed, and why."""
    return Path(directory) / f"{PREFIX}{key}{FAILED}"


def checksum_path(library: Path) -> Path:
    """The SHA-256 written beside a build when it was made."""
    return library.with_name(library.name + ".sha256")


def sha256(path: Path) -> str:
    """The file's SHA-256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a build of the library (too small, not a library, an ELF file
    cut short: :func:`elf_problem`), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(_ELF64_HEADER_BYTES)
            problem = elf_problem(f, size) if head[:4] == _MAGIC[0] else None
    except OSError as e:
        return f"{path} cannot be read: {e}"
    if size < MIN_LIBRARY_BYTES:
        return f"{path} is {size} bytes, smaller than any build of the library " \
               f"({MIN_LIBRARY_BYTES})"
    if head[:4] not in _MAGIC:
        return f"{path} is not a shared library (it starts {head[:4]!r})"
    return None if problem is None else f"{path} is cut short or damaged: {problem}"


#: bytes of a 64-bit ELF header (a 32-bit one is shorter)
_ELF64_HEADER_BYTES = 64
#: a program header's type ``PT_LOAD``: a segment the loader maps from the file
_PT_LOAD = 1


def elf_problem(f, size: int) -> str | None:
    """Why the ELF file open as ``f`` (``size`` bytes) cannot be mapped whole, or None: its
    program headers, a loaded segment (``PT_LOAD``: offset + size in the file) or its section
    headers reach past its end. The loader maps each segment from the file, and touching a
    page past the end of a file is SIGBUS, which kills the interpreter where no check could
    catch it: a truncated build whose checksum was written to match (the checksum only says
    that a file is the one written, not that it is whole). Reads the headers only (System V
    ABI, "ELF header" and "Program header")."""
    f.seek(0)
    head = f.read(_ELF64_HEADER_BYTES)
    if len(head) < 52:
        return f"{len(head)} bytes, shorter than an ELF header"
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    fields = "QQ6xHHHH" if wide else "II6xHHHH"      # e_phoff, e_shoff, …, e_shnum
    phoff, shoff, phentsize, phnum, shentsize, shnum = struct.unpack_from(
        order + fields, head, 0x20 if wide else 0x1C)
    if phnum and phentsize < (56 if wide else 32):
        return f"its program headers are {phentsize} bytes each, shorter than ELF's"
    if phoff + phnum * phentsize > size:
        return f"its program headers end at byte {phoff + phnum * phentsize}, past its {size}"
    f.seek(phoff)
    table = f.read(phnum * phentsize)
    for i in range(phnum):
        at = i * phentsize
        kind = struct.unpack_from(order + "I", table, at)[0]
        offset, filesz = struct.unpack_from(order + ("8xQ16xQ" if wide else "I8xI"), table,
                                            at + (0 if wide else 4))
        if kind == _PT_LOAD and offset + filesz > size:
            return f"segment {i} ends at byte {offset + filesz}, past its {size}"
    if shoff and shoff + shnum * shentsize > size:
        return f"its section headers end at byte {shoff + shnum * shentsize}, past its {size}"
    return None


def cached_build_problem(path: Path) -> str | None:
    """Why the cached build at ``path`` must not be loaded, or None: it is too small, not a
    shared library or cut short (:func:`elf_problem`: what a checksum written to match would
    pass, and loading it is SIGBUS), its checksum file (``<name>.sha256``, written when it was built) is
    missing, or the file's SHA-256 is not the one written (truncated, overwritten, another
    library put there)."""
    path = Path(path)
    problem = file_problem(path)
    if problem is not None:
        return problem
    try:
        want = checksum_path(path).read_text().strip()
    except OSError:
        return f"{path} has no checksum file beside it ({checksum_path(path).name})"
    got = sha256(path)
    if got != want:
        return f"{path}'s SHA-256 is {got[:16]}…, not the {want[:16]}… written when it was built"
    return None


def remembered_failure(directory: Path, key: str) -> str | None:
    """The compiler's message of an earlier failed build of ``key``, or None."""
    try:
        return marker_path(directory, key).read_text().strip() or "(no message)"
    except OSError:
        return None


def remember_failure(directory: Path, key: str, message: str) -> None:
    """Write the failure marker of ``key`` (nothing, with a debug line, where it cannot)."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        marker_path(directory, key).write_text(message + "\n")
    except OSError as e:
        log.debug("could not remember the failed build in %s: %s", directory, e)


def forget_failure(directory: Path, key: str) -> None:
    """Remove the failure marker of ``key`` (``kernels build`` tries again)."""
    try:
        marker_path(directory, key).unlink(missing_ok=True)
    except OSError:
        pass


def writable(directory: Path) -> bool:
    """Whether ``directory`` exists (made if need be) and a file can be created in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{TMP}.probe.", dir=directory)
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def private_dir() -> Path:
    """This user's folder for builds under the system's temporary folder (where the cache
    folder cannot be written): ``llminfra-kernels-<uid>``."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"llminfra-kernels-{uid}"


def ours(folder: Path) -> bool:
    """Whether ``folder`` is a real folder of this user that no one else may write (so that a
    build in it is this user's own)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def writable_dir(directory: Path) -> Path:
    """``directory`` where a build can be written there, else this user's own folder under
    the system's temporary folder (:func:`private_dir`, mode 0700, used only if :func:`ours`;
    a fresh ``mkdtemp`` if not), with a warning saying so."""
    if writable(directory):
        return directory
    private = private_dir()
    try:
        private.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        pass
    chosen = private if ours(private) and writable(private) else \
        Path(tempfile.mkdtemp(prefix=f"{TMP}-"))
    log.warning("llminfra kernels: the cache folder %s cannot be written; building in %s "
                "(set LLMINFRA_CACHE to a writable folder to keep builds)", directory, chosen)
    return chosen


def prune(directory: Path, keep: Path, builds: int = KEEP_BUILDS) -> list[Path]:
    """Remove all but the newest ``builds`` builds (and failure markers) of other keys than
    ``keep``'s, and earlier versions' files; returns what went. A process that has a build
    loaded keeps it: the file's name goes, its mapped pages stay."""
    directory = Path(directory)
    gone = [f for f in directory.glob(LEGACY_GLOB)]
    for suffix in (SUFFIX, FAILED):
        files = [f for f in directory.glob(f"{PREFIX}*{suffix}")
                 if f.name[:-len(suffix)] != keep.name[:-len(SUFFIX)]]
        files.sort(key=_mtime, reverse=True)
        gone += [g for f in files[builds:] for g in (f, checksum_path(f))]
    removed = []
    for f in gone:
        try:
            f.unlink()
            removed.append(f)
        except OSError:
            pass
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def remove_orphans(directory: Path) -> None:
    """Delete the temporary files of builds whose process is gone (killed mid-compile)."""
    for f in directory.glob(f".{TMP}.*.tmp*"):
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
