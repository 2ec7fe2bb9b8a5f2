"""Figures of a schedule: the cell graph laid out by section and stage, with its merged kernels outlined.

Columns run left to right in execution order: inputs, the hoisted `pre` items, the delayed state reads
(drawn as ``h@t-1`` taps fed by a dashed back edge from the state's producer), the per-frame stages
and the `post` items. Each item (one future kernel) is outlined; parameters appear in node labels.
"""
from __future__ import annotations

import os

import networkx as nx
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

from . import style
from ..errors import RnnGraphError
from ..ir.graph import same_frame
from ..ir.ops import SYMBOL, OpKind
from ..plan.schedule import Gemm, Schedule, fmt_read

BOX_W, BOX_H = 0.78, 0.56   # node box, in column / row units
ITEM_GAP = 1.4              # rows between the centres of stacked items' edge nodes
HEADER = 0.95               # rows above the back-edge lanes for the section headers


def draw_schedule(schedule: Schedule, path) -> None:
    """Draws `schedule` to an image file (format from the suffix, e.g. ``lstm.png``).

    Example: ``draw_schedule(build_schedule(load_cell("lstm", 32, 64)), "lstm.png")``
    """
    check_image_path(path)
    lay = _Layout(schedule)
    with style.context():
        ncols, (top, bottom) = lay.ncols, lay.row_span()
        fig = Figure(figsize=(max(7.0, 1.2 * ncols + 0.6), max(3.6, 0.62 * (bottom - top) + 2.6)))
        ax = fig.add_subplot()
        ax.set_axis_off()
        lanes = _draw_delays(ax, lay, top)
        band_top = top - 0.9 - 0.55 * max(lanes - 1, 0) - HEADER
        _draw_bands(ax, lay, band_top, bottom + 0.8)
        _draw_edges(ax, lay)
        _draw_items(ax, lay)
        _draw_nodes(ax, lay)
        ax.set_xlim(-0.6, ncols - 0.4)
        ax.set_ylim(bottom + 0.9, band_top - 0.1)   # rows grow downwards
        ax.set_title(_title(schedule), loc="left")
        handles = _legend(lay)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                  ncol=min(len(handles), 6), handlelength=2.4)
        fig.savefig(path)


def check_image_path(path) -> None:
    """Raises RnnGraphError unless `path` ends in a format matplotlib writes (.png, .pdf, .svg, ...)."""
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = os.path.splitext(os.fspath(path))[1][1:].lower()
    if suffix not in formats:
        raise RnnGraphError(f"cannot draw to {os.fspath(path)!r}: the file name must end in an image format, "
                            f"one of {', '.join('.' + f for f in sorted(formats))}; e.g. lstm.png")


class _Layout:
    """Node positions: x = column (block start + depth inside its item), y = row (barycentric)."""

    def __init__(self, s: Schedule):
        self.s, self.cell = s, s.cell
        g = self.cell.graph
        self.frame = same_frame(g)
        self.pos, self.colour, self.blocks = {}, {}, []   # blocks: (section label, colour, x0, x1)
        order = {n: k for k, n in enumerate(self.cell.frame_order())}   # producers left to right
        self.taps = sorted({(u, d) for u, _, d in g.edges(data="delay") if d > 0},
                           key=lambda t: (order[t[0]], t[1]))
        self.ncols = 0
        self._place_sources([n for n in g if self.cell.op(n).kind is OpKind.INPUT], "inputs\nper frame")
        self._place_section(s.pre, "pre\nonce, all T·B rows", style.SECTION["pre"])
        if self.taps:
            self._place_sources(self.taps, "state reads\nearlier frames", pad=0.4)   # room for the back edges
        for k, stage in enumerate(s.loop):
            self._place_block(list(stage), f"stage {k}\nper frame", style.stage_colour(k))
        self._place_section(s.post, "post\nonce, all frames", style.SECTION["post"])

    def row_span(self) -> tuple[float, float]:
        ys = [y for _, y in self.pos.values()]
        return min(ys), max(ys)

    def _place_sources(self, keys, label, pad=0.0):
        x = self.ncols + pad
        placed = [y for _, y in self.pos.values()]
        mid = sum(placed) / len(placed) if placed else 0.0
        for k, key in enumerate(keys):
            self.pos[key] = (x, mid + k - (len(keys) - 1) / 2)
            self.colour[key] = style.SECTION["input"]
        self.blocks.append((label, None, x - pad, x))
        self.ncols += 1 + pad

    def _place_section(self, items, label, colour):
        """pre/post: items split into generations of the item DAG, one block each."""
        if not items:
            return
        x0 = self.ncols
        owner = {n: k for k, it in enumerate(items) for n in it.nodes}
        q = nx.DiGraph()
        q.add_nodes_from(range(len(items)))
        q.add_edges_from((owner[u], owner[v]) for u, v in self.frame.edges
                         if u in owner and v in owner and owner[u] != owner[v])
        for gen in nx.topological_generations(q):
            self._place_block([items[k] for k in sorted(gen)], None, colour)
        self.blocks.append((label, colour, x0, self.ncols - 1))

    def _place_block(self, items, label, colour):
        """Items of one block side by side in x (by depth), stacked in y without overlap."""
        x0, shapes = self.ncols, []
        for it in items:
            depth = self._depths(it.nodes)
            rows = self._rows(it.nodes, depth)
            shapes.append((it, depth, rows))
        shapes.sort(key=lambda sh: sum(sh[2].values()) / len(sh[2]))
        floor = None
        for it, depth, rows in shapes:
            shift = 0.0 if floor is None else max(0.0, floor - min(rows.values()))
            for n in it.nodes:
                self.pos[n] = (x0 + depth[n], rows[n] + shift)
                self.colour[n] = colour
            floor = max(rows.values()) + shift + ITEM_GAP
        self.ncols += 1 + max(max(d.values()) for _, d, _ in shapes)
        if label:
            self.blocks.append((label, colour, x0, self.ncols - 1))

    def _depths(self, nodes) -> dict:
        sub = self.frame.subgraph(nodes)
        depth = {}
        for n in nx.topological_sort(sub):
            depth[n] = max((depth[u] + 1 for u in sub.predecessors(n)), default=0)
        return depth

    def _rows(self, nodes, depth) -> dict:
        """Rows per depth column: each node near the mean row of its drawn inputs, one row apart."""
        rows, order = {}, {n: k for k, n in enumerate(self.cell.graph)}
        for col in range(max(depth.values()) + 1):
            ns = [n for n in nodes if depth[n] == col]
            want = {n: self._want(n, rows) for n in ns}
            ns.sort(key=lambda n: (want[n], order[n]))
            ys = []
            for n in ns:
                ys.append(want[n] if not ys else max(want[n], ys[-1] + 1.0))
            shift = sum(want.values()) / len(ns) - sum(ys) / len(ys)
            rows.update({n: y + shift for n, y in zip(ns, ys)})
        return rows

    def _want(self, n, rows) -> float:
        ys = []
        for u, d in self.cell.reads(n):
            key = (u, d) if d else u
            if key in rows:
                ys.append(rows[key])
            elif key in self.pos:
                ys.append(self.pos[key][1])
        return sum(ys) / len(ys) if ys else 0.0


def _label(cell, n) -> str:
    op = cell.op(n)
    ins = cell.reads(n)
    params = [u for u, _ in ins if cell.op(u).kind is OpKind.PARAM]
    if op.kind is OpKind.LINEAR:
        body = f"{ins[1][0]}·{fmt_read(*ins[0])}"
    elif op.kind is OpKind.SCALE:
        body = f"× {op.attrs[0]:g}"
    elif op.kind is OpKind.SLICE:
        body = f"[{op.attrs[0]}:{op.attrs[1]}]"
    elif params:
        body = f"{SYMBOL[op.kind]} {params[0]}"
    else:
        body = SYMBOL[op.kind]
    return f"{n}\n{body}"


def _draw_nodes(ax, lay):
    cell = lay.cell
    for key, (x, y) in lay.pos.items():
        tap = isinstance(key, tuple)
        text = fmt_read(*key) if tap else (_label(cell, key) if cell.op(key).kind is not OpKind.INPUT
                                             else f"{key}\ninput [{cell.op(key).size}]")
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0,rounding_size=0.08",
                                    fc="white" if tap else lay.colour[key],
                                    ec=style.DELAY if tap else style.INK,
                                    ls="--" if tap else "-", lw=0.9, zorder=3))
        ax.text(x, y, text, ha="center", va="center", fontsize=6.5, zorder=4, linespacing=1.15,
                color=style.DELAY if tap else style.INK)


def _arrow(ax, a, b, **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=7, shrinkA=0, shrinkB=0,
                                 zorder=kw.pop("zorder", 1), **kw))


def _draw_edges(ax, lay):
    """Same-frame edges (solid) and tap -> reader edges (dashed, part of the delayed read)."""
    for u, v, d in lay.cell.graph.edges(data="delay"):
        if v not in lay.pos or (u not in lay.pos and not d):
            continue                                   # parameters are shown in the labels
        src = lay.pos[(u, d)] if d else lay.pos[u]
        dst = lay.pos[v]
        _arrow(ax, (src[0] + BOX_W / 2, src[1]), (dst[0] - BOX_W / 2, dst[1]),
               color=style.DELAY if d else style.EDGE, lw=0.8 if d else 0.7, ls="--" if d else "-")


def _draw_delays(ax, lay, top) -> int:
    """Back edges producer -> tap: up to a lane above the graph, left, down and into the tap's left side.

    Tap k (top to bottom) takes lane k (bottom to top) and the k-th vertical left of the taps, so
    back edges whose producers lie left to right do not cross. Returns the lane count.
    """
    for k, (u, d) in enumerate(lay.taps):
        (ux, uy), (tx, ty) = lay.pos[u], lay.pos[(u, d)]
        lane, left = top - 0.9 - 0.55 * k, tx - BOX_W / 2 - 0.1 - 0.06 * k
        pts = [(ux, uy - BOX_H / 2), (ux, lane), (left, lane), (left, ty), (tx - BOX_W / 2, ty)]
        xs, ys = zip(*pts[:-1])
        ax.add_line(Line2D(xs, ys, color=style.DELAY, lw=1.0, ls="--", zorder=2))
        _arrow(ax, pts[3], pts[4], color=style.DELAY, lw=1.0, ls="--", zorder=2)
        ax.text((ux + left) / 2, lane, f"{u}: t-{d}", ha="center", va="center", fontsize=6.5,
                color=style.DELAY, zorder=4, bbox=dict(fc="white", ec="none", pad=0.5))
    return len(lay.taps)


def _draw_items(ax, lay):
    """One outline per item (= one kernel): merged GEMMs and fused elementwise groups."""
    cell = lay.cell
    for it in lay.s.items:
        xs = [lay.pos[n][0] for n in it.nodes]
        ys = [lay.pos[n][1] for n in it.nodes]
        gemm = isinstance(it, Gemm)
        x0, x1 = min(xs) - BOX_W / 2 - 0.08, max(xs) + BOX_W / 2 + 0.08
        y0, y1 = min(ys) - BOX_H / 2 - 0.12, max(ys) + BOX_H / 2 + 0.12
        colour = style.GEMM if gemm else style.FUSED
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.15",
                                    fc="none", ec=colour, lw=1.3, ls="-" if gemm else (0, (4, 1.5)),
                                    zorder=2))
        n = len(it.nodes)
        text = (f"GEMM ×{n} → [{sum(it.sizes)}]" if gemm
                else f"fused ×{n} [{cell.op(it.nodes[-1]).size}]")
        ax.text(x0 + 0.04, y1 + 0.04, text, ha="left", va="top", fontsize=6, color=colour, zorder=4)


def _draw_bands(ax, lay, top, bottom):
    for label, colour, x0, x1 in lay.blocks:
        ax.add_patch(Rectangle((x0 - 0.5, top), x1 - x0 + 1, bottom - top, lw=0,
                               fc=colour or style.SECTION["input"], alpha=style.BAND_ALPHA, zorder=0))
        name, _, note = label.partition("\n")
        ax.text((x0 + x1) / 2, top + 0.12, name, ha="center", va="top", fontsize=7.5,
                fontweight="bold", color=style.INK, zorder=4)
        ax.text((x0 + x1) / 2, top + 0.45, note, ha="center", va="top", fontsize=6.5,
                color=style.INK, zorder=4)


def _title(s: Schedule) -> str:
    k = s.summary()["kernels_per_frame"]
    return (f"{s.cell.name}: {_count(len(s.pre), 'hoisted kernel')}, {_count(len(s.loop), 'per-frame stage')}, "
            f"{_count(len(s.post), 'post kernel')};  kernels per frame: forward {k['forward']['before_merge']} → "
            f"{k['forward']['after_merge']}, backward {k['backward']['before_merge']} → "
            f"{k['backward']['after_merge']}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _legend(lay) -> list:
    hs = [Patch(fc=style.SECTION["pre"], ec=style.INK, lw=0.5, label="pre: hoisted")] if lay.s.pre else []
    n = len(lay.s.loop)
    if n <= 4:
        hs += [Patch(fc=style.stage_colour(k), ec=style.INK, lw=0.5, label=f"stage {k}: per frame")
               for k in range(n)]
    else:
        hs.append(Patch(fc=style.stage_colour(0), ec=style.INK, lw=0.5, label=f"stages 0–{n - 1}: per frame"))
    if lay.s.post:
        hs.append(Patch(fc=style.SECTION["post"], ec=style.INK, lw=0.5, label="post: after loop"))
    hs += [Line2D([], [], color=style.EDGE, lw=0.8, label="same-frame edge"),
           Line2D([], [], color=style.DELAY, ls="--", lw=1.0, label="delayed edge (t-d)"),
           Patch(fc="none", ec=style.GEMM, lw=1.3, label="merged GEMM"),
           Patch(fc="none", ec=style.FUSED, lw=1.3, ls=(0, (4, 1.5)), label="fused group")]
    return hs
