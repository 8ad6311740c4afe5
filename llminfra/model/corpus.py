"""The training corpus: docstrings of the Python standard library (PSF License), rebuilt
deterministically, with a fixed train / validation split.

Recipe (``python -m llminfra.model.corpus [--stdlib DIR] [--out DIR]``): walk every ``*.py``
file of the standard library in sorted path order (skipping ``site-packages``, test suites,
``lib2to3`` and ``turtledemo``), parse it with :mod:`ast` (nothing is imported), and write, for
the module and each class and function in source order, a header line (``module json.decoder``,
``class json.decoder.JSONDecoder``, ``def json.decoder.JSONDecoder.decode(self, s, _w=...)``) and
its cleaned docstring (:func:`inspect.cleandoc`), skipping any docstring already seen. A module
goes to the validation split when the MD5 of its relative path is 0 mod 20 (~5 % of modules,
whole modules held out so validation text is unseen); the rest is training text.
The shipped files were built from CPython 3.11.7; another version gives slightly different text.

Taught in chapter 01 (the tiny model's data); the loss is measured in nats per byte on
:func:`heldout_tokens`.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import logging
import sysconfig
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SPLITS = ("train", "validation")
_SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__",
                        "lib2to3", "turtledemo"})
log = logging.getLogger(__name__)


def corpus_path(split: str, data_dir: Path = DATA_DIR) -> Path:
    """Path of the gzipped UTF-8 text of ``split`` (``"train"`` or ``"validation"``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    return Path(data_dir) / f"stdlib_docstrings.{split}.txt.gz"


def _module_docs(tree: ast.Module, module: str, seen: set[str]) -> list[str]:
    """Header + docstring blocks of one parsed module, in source order, unseen ones only."""
    blocks: list[str] = []

    def visit(node: ast.AST, qualname: str, header: str) -> None:
        doc = ast.get_docstring(node, clean=True)
        if doc and doc not in seen:
            seen.add(doc)
            blocks.append(f"{header}\n\n{doc}\n")
        for child in getattr(node, "body", []):
            if isinstance(child, ast.ClassDef):
                name = f"{qualname}.{child.name}"
                visit(child, name, f"class {name}")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{qualname}.{child.name}"
                visit(child, name, f"def {name}({ast.unparse(child.args)})")

    visit(tree, module, f"module {module}")
    return blocks


def _is_validation(relpath: str) -> bool:
    return int(hashlib.md5(relpath.encode()).hexdigest(), 16) % 20 == 0


def build_corpus(stdlib_dir: str | Path) -> dict[str, str]:
    """``{"train": text, "validation": text}`` built from the standard library in
    ``stdlib_dir`` by the recipe in this module's docstring (deterministic)."""
    root = Path(stdlib_dir)
    if not root.is_dir():
        raise ValueError(f"stdlib_dir {str(root)!r} is not a directory")
    seen: set[str] = set()
    parts: dict[str, list[str]] = {s: [] for s in SPLITS}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p in _SKIP_DIRS for p in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            log.info("skipping %s (does not parse)", rel)
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        split = "validation" if _is_validation(rel.as_posix()) else "train"
        parts[split].extend(_module_docs(tree, module, seen))
    return {s: "\n".join(blocks) for s, blocks in parts.items()}


def write_corpus(texts: dict[str, str], out_dir: str | Path = DATA_DIR) -> list[Path]:
    """Write each split as gzip (mtime 0, so identical text gives identical bytes)."""
    written = []
    for split in SPLITS:
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
            f.write(texts[split].encode("utf-8"))
        path = corpus_path(split, Path(out_dir))
        path.write_bytes(buf.getvalue())
        written.append(path)
    return written


def load_text(split: str, data_dir: str | Path = DATA_DIR) -> str:
    """The shipped text of ``split``."""
    path = corpus_path(split, Path(data_dir))
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; rebuild it with "
                                f"`python -m llminfra.model.corpus`")
    return gzip.decompress(path.read_bytes()).decode("utf-8")


def corpus_tokens(split: str, data_dir: str | Path = DATA_DIR) -> torch.Tensor:
    """The UTF-8 bytes of ``split`` as a 1-D int64 tensor of byte ids (the tokenizer's ids)."""
    raw = load_text(split, data_dir).encode("utf-8")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def heldout_tokens(max_tokens: int | None = None) -> torch.Tensor:
    """The shipped validation split as byte ids, 1-D int64 (its first ``max_tokens`` only,
    when given): the held-out text on which the tiny model's perplexity is reported."""
    tokens = corpus_tokens("validation")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or max_tokens < 2:
            raise ValueError(f"max_tokens must be an int >= 2 or None, got {max_tokens!r}")
        tokens = tokens[:max_tokens]
    return tokens


def main(argv: list[str] | None = None) -> None:
    """Command line: rebuild the corpus files from a standard library directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"],
                        help="standard library directory (default: this interpreter's)")
    parser.add_argument("--out", default=str(DATA_DIR), help="output directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    texts = build_corpus(args.stdlib)
    for path in write_corpus(texts, args.out):
        log.info("wrote %s (%d bytes compressed)", path, path.stat().st_size)
    for split, text in texts.items():
        log.info("%s: %d bytes of text", split, len(text.encode("utf-8")))


if __name__ == "__main__":
    main()
