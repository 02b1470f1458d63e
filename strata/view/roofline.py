"""The roofline of a program's kernels against this machine's ceilings, as an inline SVG.

Why these numbers: the page draws only what was measured or counted elsewhere. A kernel's time is
`--bench`'s (each kernel alone, NativeProgram.kernel_runner); its FLOPs and bytes are the cost
model's (tune/cost.py `kernel_work`: the float operations its loops execute, every parameter
moved once); the ceilings are the cached profile of `strata machine --measure` (tune/machine.py),
read and never measured here: without one the page says so and draws nothing."""
from __future__ import annotations

import html
import math

from ..tune.cost import kernel_work
from ..tune.machine import CEILINGS

NO_PROFILE = "no machine profile: run `strata machine --measure`"
W, H, LEFT, BOTTOM, TOP, RIGHT = 600, 270, 52, 34, 10, 225


def roofline(kernels, bench: dict | None, profile) -> dict | None:
    """{"points": [...], "ceilings": {...}, "svg": text} for the kernels `bench` timed, or
    {"note": NO_PROFILE} when no profile is cached; None without timings."""
    if not bench or not bench.get("kernels"):
        return None
    if profile is None or not profile.ceilings:
        return {"note": NO_PROFILE}
    points = []
    for i, k in enumerate(kernels):
        ms = bench["kernels"].get(k.name)
        if not ms:
            continue
        flops, nbytes = kernel_work(k)
        points.append({"kernel": i, "name": k.name, "flops": flops, "bytes": nbytes, "ms": ms,
                       "intensity": flops / nbytes if nbytes else 0.0,
                       "gflops": flops / ms / 1e6, "gbs": nbytes / ms / 1e6})
    ceilings = {n: v for n, v in profile.ceilings.items()
                if CEILINGS.get(n) == "GB/s" or n.endswith("peak")}
    where = f"{profile.model}, {profile.cores} threads, measured {profile.measured}"
    return {"points": points, "ceilings": ceilings, "where": where,
            "svg": svg(points, ceilings)}


def _decades(lo: float, hi: float) -> tuple[int, int]:
    return math.floor(math.log10(lo)), math.ceil(math.log10(hi))


def svg(points: list[dict], ceilings: dict[str, float]) -> str:
    """Log-log axes: FLOP/byte across, GFLOP/s up; a memory ceiling is a slanted line (GB/s x
    FLOP/byte), a compute one flat; a kernel with no float operation sits on the bottom axis."""
    memory = {n: v for n, v in ceilings.items() if not n.endswith("peak")}
    compute = {n: v for n, v in ceilings.items() if n.endswith("peak")}
    top = max(compute.values(), default=max(memory.values(), default=1.0) * 100)
    fastest = max(memory.values(), default=1.0)
    xs = [p["intensity"] for p in points if p["intensity"] > 0] + [top / fastest]
    ys = [p["gflops"] for p in points if p["gflops"] > 0] + [top]
    x0, x1 = _decades(min(xs + [0.1]) / 2, max(xs) * 4)
    y0, y1 = _decades(min(ys + [min(memory.values(), default=1.0) * 10 ** x0]) / 2, top * 1.5)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (math.log10(max(x, 10 ** x0)) - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + ph - (math.log10(max(y, 10 ** y0)) - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="roofline" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="roofline">',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" class="frame"/>']
    for e in range(x0, x1 + 1):
        out.append(f'<text x="{px(10 ** e):.1f}" y="{H - BOTTOM + 13}" class="tick">{10.0 ** e:g}</text>')
    for e in range(y0, y1 + 1):
        out.append(f'<text x="{LEFT - 4}" y="{py(10 ** e) + 4:.1f}" class="tick end">{10.0 ** e:g}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 4}" class="axis">FLOP / byte</text>')
    out.append(f'<text x="12" y="{TOP + ph / 2}" class="axis" transform="rotate(-90 12 '
               f'{TOP + ph / 2})">GFLOP/s</text>')
    # each ceiling a style of its own, named in the legend on the right (labels on the lines
    # would overlap: a profile's bandwidths are within a decade of each other)
    for i, (name, value) in enumerate(sorted(ceilings.items(), key=lambda kv: (kv[0] in compute, kv[1]))):
        if name in memory:
            a, b = 10 ** x0, min(top / value, 10 ** x1)    # up to the highest compute ceiling
            line, unit = (px(a), py(value * a), px(b), py(value * b)), "GB/s"
        else:
            line, unit = (px(value / fastest), py(value), LEFT + pw, py(value)), "GFLOP/s"
        kind = "mem" if name in memory else "flop"
        out.append('<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" '.format(*line) +
                   f'class="ceiling {kind} c{i}" data-ceiling="{html.escape(name)}"/>')
        y = TOP + 8 + 14 * i
        out.append(f'<line x1="{W - RIGHT + 8}" y1="{y - 3}" x2="{W - RIGHT + 26}" y2="{y - 3}" '
                   f'class="ceiling {kind} c{i}"/><text x="{W - RIGHT + 30}" y="{y}" '
                   f'class="label">{html.escape(name)} {value:g} {unit}</text>')
    for p in points:
        tip = (f"{p['name']}: {p['intensity']:.3g} FLOP/byte, {p['gflops']:.3g} GFLOP/s, "
               f"{p['gbs']:.3g} GB/s ({p['ms']:.4f} ms)")
        out.append(f'<circle cx="{px(p["intensity"]):.1f}" cy="{py(p["gflops"]):.1f}" r="4.5" '
                   f'class="point{"" if p["flops"] else " nofp"}" data-k="{p["kernel"]}">'
                   f'<title>{html.escape(tip)}</title></circle>')
    out.append("</svg>")
    return "".join(out)
