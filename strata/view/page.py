"""The page: one HTML file with its CSS, script and data inlined, so it opens offline, from a
file or from `strata view --serve`, with no CDN and no request at all."""
from __future__ import annotations

import html
import json
import re
from importlib import resources


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render(data: dict) -> str:
    """The HTML text of the page showing `data` (collect.collect's dict)."""
    # "</script>" (or "<!--" then "<script") inside the JSON would end the element early or
    # keep it open: those "<" are written as the JSON escape \u003c, which parses the same
    payload = re.sub(r"<(?=[!/sS])", r"\\u003c", json.dumps(data, separators=(",", ":")))
    title = html.escape(f"strata view: {data['title']}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>{_asset("page.css")}</style>
</head><body>
<header id="top"><h1>{title}</h1><div id="meta"></div>
<input id="search" type="search" placeholder="search kernels and ops (/)" autocomplete="off">
</header>
<main>
<nav id="side"><h2>Torch IR ops</h2><ul id="ops"></ul><h2>Kernels</h2><ul id="kernels"></ul></nav>
<section id="stages"></section>
</main>
<section id="bottom">
<div id="pipeline"><h2 id="pipetitle">Pass pipeline</h2>
<p class="hint">j / k or the arrow keys step through the passes; &#9679; marks a pass that changed
the kernel, &#9675; one that did not.</p><ol id="passes"></ol></div>
<div id="detail"><h2 id="difftitle">Diff</h2><pre id="diff"></pre>
<h2>Knobs</h2><div id="knobs"></div><div id="tuning"></div>
<div id="roofbox" hidden><h2>Roofline</h2><div id="roofline"></div></div>
<h2>Fusion decisions</h2><ul id="fusion"></ul>
<details><summary>Log (-v)</summary><pre id="log"></pre></details></div>
</section>
<script type="application/json" id="data">{payload}</script>
<script>{_asset("page.js")}</script>
</body></html>
"""
