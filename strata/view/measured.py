"""Measured results the page shows beside a kernel: the simulator's access counters when
`strata view --device sim` ran the program (the counters `strata run --device sim --profile`
prints, kernel_ir/sim_profile.py), gathered during the verdict's own run, so they cost nothing
more than that run; and `--bench`'s CPU timings (bench/cpu_bench.py `view_bench`)."""
from __future__ import annotations


def sim_counters(profiles: dict) -> dict[str, list[list[str]]]:
    """{kernel: [[counter, value], ...]} from sim_profile's {name: KernelProfile}."""
    out = {}
    for name, prof in profiles.items():
        acc = prof.accesses
        rows = []
        for kind in ("global load", "global store", "shared load", "shared store"):
            a = acc[kind]
            if a.requests:
                unit = "sectors" if kind.startswith("global") else "wavefronts"
                rows.append([f"{kind}: {unit} per request, actual / ideal", f"{a.ratio:.2f}"])
        for kind, minimum in (("global load", prof.minimum_read),
                              ("global store", prof.minimum_written)):
            if minimum:
                rows.append([f"{kind}: bytes / the minimum", f"{acc[kind].bytes / minimum:.2f}x"])
        rows.append(["warp issues", ", ".join(f"{k} {n}" for k, n in prof.issued.most_common())])
        rows.append(["lane operations", str(prof.lane_ops)])
        if prof.tensor_flops:
            rows.append(["tensor-core flops", str(prof.tensor_flops)])
        out[name] = rows
    return out
