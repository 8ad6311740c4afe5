"""How a course widget presents itself: a named panel, and images at their natural size.

A notebook opened before it is run shows each output's stored form. For a widget that is the
saved widget state (``metadata.widgets``, written by ``python -m llminfra.course.execute``),
which JupyterLab draws as the widget itself; where no widget manager runs (nbval, a plain text
view, GitHub's preview) it is the ``text/plain`` repr. ipywidgets' own repr is the constructor
call (``VBox(children=(IntSlider(…), Image(value=b'\\x89PNG…')))``), which tells a learner
nothing. :class:`Panel` is a ``VBox`` whose repr says what the widget is and that running the
cell brings it to life, and never changes with the widget's values — so it is also stable for
nbval, which compares ``text/plain``.

:func:`natural_size` pins an ``Image`` widget to the pixel size of its PNG, so that a flex box
does not stretch it (blurred text, distorted axes). Used by every panel of chapters 00–07.
"""

from __future__ import annotations

import struct

import ipywidgets as widgets

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Panel(widgets.VBox):
    """A ``VBox`` with a stable, human ``repr``: ``Panel(children, title="…", how="…")``.

    ``repr(panel)`` is ``"[interactive widget] <title> — <how>. Run this cell to bring it to
    life."``, whatever the children hold.
    """

    def __init__(self, children=(), *, title: str, how: str = "", **kwargs):
        if not title:
            raise ValueError("a Panel needs a title (what the widget is)")
        super().__init__(children=list(children), **kwargs)
        self._llminfra_title, self._llminfra_how = title, how

    def __repr__(self) -> str:
        how = f" — {self._llminfra_how}" if self._llminfra_how else ""
        return (f"[interactive widget] {self._llminfra_title}{how}. "
                "Run this cell (a live Python kernel) to bring it to life.")


def png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` in pixels from a PNG's IHDR chunk (bytes 16–24, big-endian).

    A 560 × 192 PNG has ``struct.pack(">II", 560, 192)`` at offset 16.
    """
    if len(png) < 24 or not png.startswith(PNG_SIGNATURE):
        raise ValueError("not PNG bytes (the first 8 bytes are not the PNG signature)")
    return struct.unpack(">II", png[16:24])


def natural_size(image: widgets.Image) -> widgets.Image:
    """Fix ``image``'s layout to the pixel size of its current PNG (no stretching); returns it.

    Call again after changing ``image.value`` if the new picture has another size.
    """
    w, h = png_size(bytes(image.value))
    image.layout.width, image.layout.height = f"{w}px", f"{h}px"
    image.layout.align_self = "flex-start"
    image.layout.object_fit = "contain"
    return image
