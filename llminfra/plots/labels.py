"""Labels that read at a glance: one minimum font size, and point labels that do not collide.

Every figure of the course is shown at its natural size (80 dpi, chapter 00's ``setup``), so a
7-pt legend is 8 pixels tall. :data:`MIN_FONT_PT` is the smallest font the figures use.

:func:`label_points` writes a label beside each point, each where it overlaps no other label,
no marker, and as few line pixels as it can: a greedy search over positions around the point
(right, left, above, below, then further out with a thin leader line), done when the figure is
drawn — after ``tight_layout`` or a resize has fixed where the points land — so the placement
holds for the figure as shown. The figures' tests (``tests/test_plots_read_well.py``) check
the result on the drawn figure: fonts ≥ ``MIN_FONT_PT``, no two texts overlapping.
"""

from __future__ import annotations

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

#: the smallest font (points) of any text in the course's figures
MIN_FONT_PT = 9.0
#: offsets tried for a label, in points from its point, with the alignment that puts the text
#: on that side: beside, above / below, then 1 … 6 line heights further up or down
_NEAR = [((6, 2), "left", "bottom"), ((6, -2), "left", "top"), ((-6, 2), "right", "bottom"),
         ((-6, -2), "right", "top"), ((0, 7), "center", "bottom"), ((0, -7), "center", "top")]
_PAD_PX = 1.5


def _candidates(line_pt: float):
    yield from _NEAR
    for k in range(1, 7):
        for dx, ha in ((10, "left"), (-10, "right")):
            for sign, va in ((1, "bottom"), (-1, "top")):
                yield (dx, sign * (2 + k * line_pt)), ha, va


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _inside(a: Bbox, points: np.ndarray) -> int:
    if not len(points):
        return 0
    x, y = points[:, 0], points[:, 1]
    return int(np.count_nonzero((x > a.x0) & (x < a.x1) & (y > a.y0) & (y < a.y1)))


def _line_pixels(ax: Axes) -> np.ndarray:
    """Points every ~3 px along the axes' lines (not markers-only lines), in display pixels."""
    out = []
    for line in ax.get_lines():
        if not line.get_visible() or line.get_linestyle() in ("None", "", " "):
            continue
        xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        for a, b in zip(xy[:-1], xy[1:]):
            n = max(2, int(np.hypot(*(b - a)) / 3))
            out.append(a + np.linspace(0, 1, n)[:, None] * (b - a))
    return np.concatenate(out) if out else np.empty((0, 2))


class _Placer(Artist):
    """Draws nothing; when the axes are drawn (first among their children), moves each label
    of :func:`label_points`, in turn, to its cheapest position: overlapping a label, a marker or
    the legend costs most, leaving the axes next, then each line pixel covered, then distance."""

    def __init__(self, ax: Axes, labels: list[Annotation], marker_px: float):
        super().__init__()
        self.ax, self.labels, self.marker_px = ax, labels, marker_px
        self.set_zorder(-1e9)
        self.set_in_layout(False)

    def get_window_extent(self, renderer=None):
        return Bbox.null()

    def draw(self, renderer):
        ax, r = self.ax, self.marker_px
        frame = ax.get_window_extent(renderer)
        anchors = np.array([ax.transData.transform(a.xy) for a in self.labels]).reshape(-1, 2)
        markers = [Bbox.from_extents(x - r, y - r, x + r, y + r) for x, y in anchors]
        lines = _line_pixels(ax)
        legend = ax.get_legend()
        taken = [legend.get_window_extent(renderer)] if legend and legend.get_visible() else []
        taken += [t.get_window_extent(renderer) for t in ax.texts
                  if t not in self.labels and t.get_visible() and t.get_text()]
        line_pt = self.labels[0].get_fontsize() * 1.25
        for label in self.labels:
            best, best_cost = None, float("inf")
            for offset, ha, va in _candidates(line_pt):
                box = _try(label, offset, ha, va, renderer)
                outside = box.width * box.height - _overlap(box, frame)
                cost = (1e6 * sum(_overlap(box, t) for t in taken)
                        + 1e6 * sum(_overlap(box, m) for m in markers) + 1e4 * outside
                        + 5 * _inside(box, lines) + abs(offset[1]))
                if cost < best_cost:
                    best, best_cost = (offset, ha, va), cost
            taken.append(_try(label, *best, renderer))
            if label.arrow_patch is not None:
                label.arrow_patch.set_visible(abs(best[0][1]) > line_pt)


def _try(label: Annotation, offset, ha: str, va: str, renderer) -> Bbox:
    """Put ``label`` at ``offset`` (points) with that alignment; its text's box in pixels."""
    label.xyann = offset
    label.set(ha=ha, va=va)
    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer).padded(_PAD_PX)


def label_points(ax: Axes, points: list[tuple[float, float, str]], fontsize: float = MIN_FONT_PT,
                 marker_px: float = 4.0, color: str = "black") -> list[Annotation]:
    """Write ``label`` beside each ``(x, y, label)`` (data coordinates) of ``ax``, placed so
    that no two labels, no label and marker and no label and the legend overlap (positions
    chosen at draw time, see the module's docstring). ``marker_px``: the markers' radius in
    pixels. Returns the annotations, in the order given (earlier labels get the nearer spots)."""
    labels = [ax.annotate(text, (x, y), xytext=(6, 2), textcoords="offset points",
                          fontsize=max(fontsize, MIN_FONT_PT), color=color, ha="left",
                          va="bottom", annotation_clip=False,
                          arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "#8c8c8c",
                                      "shrinkA": 1, "shrinkB": marker_px})
              for x, y, text in points]
    if labels:
        ax.add_artist(_Placer(ax, labels, marker_px))
    return labels


def merge_coincident(points: list[tuple[float, float, str]], tol: float = 0.02,
                     log: tuple[bool, bool] = (False, False)) -> list[tuple[float, float, str]]:
    """Points closer than ``tol`` (a fraction of each axis' range; of its decades when
    ``log``) share one label, their names joined: ``h200`` and ``h200-nvl`` at the same
    (141 GiB, 4.8 TB/s) become one point labelled ``"h200, h200-nvl"``."""
    if not points:
        return []
    xy = np.array([[np.log10(x) if log[0] else x, np.log10(y) if log[1] else y]
                   for x, y, _ in points], dtype=float)
    span = np.ptp(xy, axis=0)
    span[span == 0] = 1.0
    groups: list[list[int]] = []
    for i in range(len(points)):
        for g in groups:
            if np.all(np.abs(xy[g[0]] - xy[i]) <= tol * span):
                g.append(i)
                break
        else:
            groups.append([i])
    return [(points[g[0]][0], points[g[0]][1], ", ".join(points[i][2] for i in g)) for g in groups]
