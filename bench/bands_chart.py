#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The chart of bench/run_bands.sh's tables: the exposed communication ((layer - attention) / the
# serial exchange) against the band count G at attention ratio f = 1, one line a table (backend,
# ranks, attention kind). Plain SVG (no plotting library):
#
#   bench/bands_chart.py [bands.md] [bands.svg]     (defaults: bench/results/bands.md, .svg)
import os
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "results", "bands.md")
dst = sys.argv[2] if len(sys.argv) > 2 else os.path.splitext(src)[0] + ".svg"

tables, name = [], None  # (title, progress, {G: exposed at f = 1})
for line in open(src):
    m = re.match(r"# ulysses_perf --op bands: (.*)", line)
    if m:
        name = m.group(1)
        tables.append([name, "", {}])
        continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if name is None or len(cells) != 12 or not re.match(r"^\d+$", cells[0]):
        continue
    f, g, exposed = float(cells[1]), int(cells[2].rstrip("*")), float(cells[10])
    if g > 1 and not tables[-1][1]:
        tables[-1][1] = cells[3]
    if f == 1:
        tables[-1][2][g] = exposed
series, seen = [], set()
for title, progress, pts in tables:  # (under SMPI every group prints the same table: one line)
    key = (title, progress, tuple(sorted(pts.items())))
    if key in seen:
        continue
    seen.add(key)
    series.append((title + (", " + progress if progress else ""), pts))
series = [(n, pts) for n, pts in series if pts]
W, H, L, R, T, B = 900, 520, 70, 330, 30, 60
gs = sorted({g for _, pts in series for g in pts})
ymax = max(1.5, max(v for _, pts in series for v in pts.values()))
ymax = min(ymax, 3.0)


def x(g):
    return L + (W - L - R) * (gs.index(g) / max(1, len(gs) - 1))


def y(v):
    return T + (H - T - B) * (1 - min(v, ymax) / ymax)


colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<text x="{L}" y="18" font-size="14">Exposed communication at f = 1 against the band count G (bench/run_bands.sh)</text>']
for k in range(0, 7):
    v = ymax * k / 6
    out.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#ddd"/>')
    out.append(f'<text x="{L - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
for g in gs:
    out.append(f'<text x="{x(g):.1f}" y="{H - B + 18}" text-anchor="middle">{g}</text>')
out.append(f'<text x="{(L + W - R) / 2:.1f}" y="{H - 20}" text-anchor="middle">G (bands)</text>')
out.append(f'<text x="16" y="{(T + H - B) / 2:.1f}" transform="rotate(-90 16 {(T + H - B) / 2:.1f})" text-anchor="middle">'
           '(layer - attention) / serial exchange</text>')
for i, (n, pts) in enumerate(series):
    c = colors[i % len(colors)]
    p = " ".join(f"{x(g):.1f},{y(pts[g]):.1f}" for g in sorted(pts))
    out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{p}"/>')
    for g in sorted(pts):
        out.append(f'<circle cx="{x(g):.1f}" cy="{y(pts[g]):.1f}" r="3" fill="{c}"/>')
    label = n.replace(", --copies 0 (the messages alone)", "").replace("Llama-3.1-", "")
    out.append(f'<rect x="{W - R + 14}" y="{T + 16 * i}" width="10" height="10" fill="{c}"/>')
    out.append(f'<text x="{W - R + 30}" y="{T + 16 * i + 9}" font-size="10">{label}</text>')
out.append("</svg>")
open(dst, "w").write("\n".join(out) + "\n")
print(f"bands_chart.py: {dst} ({len(series)} series)")
