#!/usr/bin/python3
"""Draws loss curves as a standalone SVG (no plotting library needed).

Usage: scripts/plot_curves.py RESULT.json OUT.svg

RESULT.json is a `grad_bench train` result recorded by scripts/record_bench.py
(or the tool's own --json output): one curve per run (`scheme`, `losses`).
scripts/gen_benchmarks.py draws the same plot for every recorded grad_train
result next to docs/benchmarks.md; this script is for a look at one file.

The output is a pure function of the input (no dates, fixed number
formatting), so a regenerated plot only changes when the data does.
"""

import html
import json
import math
import pathlib
import sys

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 64, 170, 36, 48
# Distinguishable on white, also for the common colour-vision deficiencies
# (Okabe-Ito).
COLOURS = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7",
           "#F0E442")


def nice_ticks(lo, hi, count=5):
    """About `count` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def render_svg(runs, title):
    """runs: [(label, [loss per step])]. Returns the SVG text."""
    curves = [(label, [float(v) for v in losses]) for label, losses in runs if losses]
    if not curves:
        raise ValueError("no curve to draw")
    steps = max(len(c) for _, c in curves)
    values = [v for _, c in curves for v in c if math.isfinite(v)]
    yt = nice_ticks(min(values), max(values))
    ylo, yhi = yt[0], yt[-1]
    xt = nice_ticks(0, max(steps - 1, 1))
    xhi = xt[-1]
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i):
        return LEFT + pw * i / xhi

    def y(v):
        return TOP + ph * (1 - (v - ylo) / (yhi - ylo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="20" font-size="14">{html.escape(title)}</text>']
    for t in yt:
        out.append(f'<line x1="{LEFT}" y1="{y(t):.1f}" x2="{LEFT + pw}" y2="{y(t):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in xt:
        out.append(f'<line x1="{x(t):.1f}" y1="{TOP + ph}" x2="{x(t):.1f}" y2="{TOP + ph + 4}" '
                   'stroke="#000"/>')
        out.append(f'<text x="{x(t):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{t:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#000"/>')
    out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle">step</text>')
    out.append(f'<text x="16" y="{TOP + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + ph / 2:.1f})">loss</text>')
    for k, (label, c) in enumerate(curves):
        colour = COLOURS[k % len(COLOURS)]
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(c) if math.isfinite(v))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{pts}"/>')
        ly = TOP + 14 + 18 * k
        out.append(f'<line x1="{LEFT + pw + 12}" y1="{ly - 4}" x2="{LEFT + pw + 36}" y2="{ly - 4}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{LEFT + pw + 42}" y="{ly}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def train_svg(result, title):
    """The plot of a grad_bench train result (the tool's JSON)."""
    return render_svg([(r.get("scheme", "?"), r.get("losses", [])) for r in result.get("runs", [])],
                      title)


def main(argv):
    if argv[:1] in (["-h"], ["--help"]) or len(argv) != 2:
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    data = json.loads(pathlib.Path(argv[0]).read_text())
    result = data.get("result", data)  # a recorded file or the tool's own output
    title = f"grad_bench train: loss per step, DP {result.get('ranks')}"
    pathlib.Path(argv[1]).write_text(train_svg(result, title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
