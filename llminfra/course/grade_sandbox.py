"""Each learner's notebook graded in its own throwaway copy of the course, and what a notebook
may have rewritten on disk found after it ran (used by :mod:`llminfra.course.grade`).

A learner's kernel runs as the teacher's own user: whatever files the teacher can write, an
answer cell can too. So the grader never lets a file on disk decide a grade after grading
began:

* before the first kernel starts, the grader reads into memory every notebook it will grade,
  every reference exercise notebook, and the package's files (:class:`Tree`);
* each notebook then runs in a fresh temporary folder (:func:`sandbox`): a copy of the package
  written from that memory (the kernel imports ``llminfra`` from there: ``PYTHONPATH``), and a
  copy of the learner's own folder (their data files, never another student's) as the working
  directory. An answer that rewrites a checker rewrites its own copy, which is deleted after it;
* after each notebook the grader compares the files on disk with what it read
  (:class:`Watch`): a rewritten reference or class notebook is put back and the notebook graded
  just before is reported as having rewritten it; a rewritten package source file is reported
  (not put back: the package is the teacher's install — reinstall it).

What this does not do: keep a kernel from *reading* other files (it runs as the teacher; an
operating-system sandbox — a container, another user — is the tool for that).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: folders of the package that are not copied into a sandbox (caches)
SKIPPED_DIRS = frozenset({".pytest_cache", ".mypy_cache", ".ruff_cache"})
#: entries of a learner's folder never copied into the sandbox: an ``llminfra`` folder would
#: shadow the course's package on the kernel's path
SHADOWING = frozenset({"llminfra", ".ipynb_checkpoints"})


@dataclass(frozen=True)
class File:
    """One file as the grader read it: its bytes and modification time (kept, so that the
    package's compiled ``__pycache__`` stays valid in a copy)."""

    data: bytes
    mtime_ns: int


class Tree:
    """The files under ``root`` (relative path -> :class:`File`), read once into memory."""

    def __init__(self, root: Path, pattern: str = "**/*"):
        self.root = Path(root)
        self.files: dict[str, File] = {}
        for path in sorted(self.root.glob(pattern)):
            rel = path.relative_to(self.root)
            if path.is_file() and not SKIPPED_DIRS.intersection(rel.parts):
                self.files[rel.as_posix()] = File(path.read_bytes(), path.stat().st_mtime_ns)

    def write(self, target: Path) -> None:
        """Recreate the tree under ``target`` (modification times kept)."""
        for rel, f in self.files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f.data)
            os.utime(path, ns=(f.mtime_ns, f.mtime_ns))


def _learner_files(folder: Path, class_root: Path, target: Path) -> None:
    """Copy the learner's own files next to their notebook: the notebooks' folder's plain files
    (not the notebooks: the graded one is run from memory), and its sub-folders unless the
    folder is the class root (whose sub-folders are the other students)."""
    for entry in sorted(folder.iterdir()):
        if entry.name in SHADOWING or entry.is_symlink():
            continue
        if entry.is_file() and entry.suffix != ".ipynb":
            shutil.copy2(entry, target / entry.name)
        elif entry.is_dir() and folder.resolve() != class_root.resolve():
            shutil.copytree(entry, target / entry.name, symlinks=False,
                            ignore=shutil.ignore_patterns(*SHADOWING, "*.ipynb"))


@contextmanager
def sandbox(package: Tree, folder: Path, class_root: Path):
    """``(cwd, env)`` for one notebook's kernel: a fresh temporary folder holding a copy of the
    package (``site/llminfra``, first on ``PYTHONPATH``) and of the learner's own files
    (``work/``); deleted afterwards, whatever the kernel wrote into it."""
    top = Path(tempfile.mkdtemp(prefix="llminfra-grade-"))
    try:
        site, work = top / "site", top / "work"
        package.write(site / package.root.name)
        work.mkdir()
        try:
            _learner_files(folder, class_root, work)
        except OSError:              # an unreadable file of the learner's: graded without it
            pass
        path = os.environ.get("PYTHONPATH", "")
        env = {"PYTHONPATH": str(site) + (os.pathsep + path if path else "")}
        yield work, env
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class Watch:
    """Files the grader read before grading, checked again after each notebook.

    ``restore=True`` files (reference and class notebooks) are put back when changed; the
    others (the package) are only reported. :meth:`changed` returns the paths found changed
    since the last call, each reported once."""

    def __init__(self):
        self._files: dict[Path, tuple[bytes, str, bool]] = {}
        self._stat: dict[Path, tuple[int, int]] = {}

    def add(self, path: Path, data: bytes, restore: bool) -> None:
        path = Path(path)
        self._files[path] = (data, hashlib.sha256(data).hexdigest(), restore)
        self._stat[path] = self._stat_of(path)

    def add_tree(self, tree: Tree, restore: bool = False, suffix: str = ".py") -> None:
        """Watch ``tree``'s files ending in ``suffix`` (the package's code: its data files are
        the course's own to rewrite, a recorded benchmark run for one)."""
        for rel, f in tree.files.items():
            if "__pycache__" not in rel and rel.endswith(suffix):
                self.add(tree.root / rel, f.data, restore)

    @staticmethod
    def _stat_of(path: Path) -> tuple[int, int]:
        try:
            st = path.stat()
            return st.st_size, st.st_mtime_ns
        except OSError:
            return -1, -1

    def changed(self) -> list[tuple[Path, bool]]:
        """``(path, put_back)`` for every watched file whose contents changed on disk (or that
        was deleted) since it was read; the ones to restore are written back."""
        found = []
        for path, (data, digest, restore) in self._files.items():
            stat = self._stat_of(path)
            if stat == self._stat[path]:
                continue                      # same size and time: not rewritten
            if _digest(path) != digest:
                put_back = False
                if restore:
                    try:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(data)
                        put_back = True
                    except OSError:
                        pass
                found.append((path, put_back))
            self._stat[path] = self._stat_of(path)
        return found
