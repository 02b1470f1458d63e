"""Measured results the page shows beside a kernel: the simulator's access counters when
`strata view --device sim` ran the program (the counters `strata run --device sim --profile`
prints, kernel_ir/sim_profile.py), gathered during the verdict's own run, so they cost nothing
more than that run."""
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


BENCH_ROUNDS = 11           # fewer than `strata run --bench`'s 31: the page is a first look


def cpu_bench(program, snippet) -> dict:
    """`strata view --device cpu --bench`: medians of interleaved rounds (bench/cpu_bench.py's
    method) of eager, torch.compile and strata's whole program, and of each strata kernel run
    alone on the buffers a whole run filled (the tuner's way, runtime/native.py); plus the
    sentence saying when other processes took the CPU meanwhile."""
    import statistics

    import torch

    from ..bench.cpu_bench import interleaved, interleaved_samples
    from ..cpu_load import OtherLoad, busy_sentence
    module, inputs = snippet.module, snippet.example_inputs
    torch._dynamo.reset()
    load = OtherLoad()
    whole = interleaved({"eager": module, "torch.compile": torch.compile(module, dynamic=False),
                         "strata": program}, inputs, rounds=BENCH_ROUNDS)
    run = program.runtime.kernel_runner([x.clone() for x in inputs])
    kernels = {}
    for k, kernel in enumerate(program.kernels):
        samples = interleaved_samples({"k": lambda: run(k)}, (), rounds=5)["k"]
        kernels[kernel.name] = statistics.median(samples)
    return {"whole": whole, "kernels": kernels, "rounds": BENCH_ROUNDS,
            "busy": busy_sentence(load.share()) or ""}
