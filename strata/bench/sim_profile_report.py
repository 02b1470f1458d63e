"""`python -m strata.bench.sim_profile_report`: the simulator's access counters
(kernel_ir/sim_profile.py) for the op suite's row and elementwise kernels, one line per kernel:
sectors and bank-conflict wavefronts per request against the ideal, bytes against the minimum,
ptxas's registers and spills, the occupancy they allow and the H100 roofline estimate.
GPU evidence without a GPU (docs/sim-profile-*.md)."""
from __future__ import annotations

from ..api import compile as strata_compile
from ..kernel_ir.sim_profile import profiling
from .cases import cases
from .cli_sim_profile import gpu_columns

OPS = ("rmsnorm", "layernorm", "softmax", "rope", "silu_mul", "gelu", "add_rmsnorm")


def main() -> None:
    print(f"{'case':<36} {'kernel':<24} {'ld':>5} {'st':>5} {'smem ld':>7} {'smem st':>7} "
          f"{'read':>6} {'written':>7} {'regs':>4} {'spills':>6} {'occupancy':>16} {'est us':>6}")
    for c in cases(models=("tinyllama",), seqs=(1, 128), dtypes=("f32", "bf16"), ops=OPS):
        module, inputs = c.build("cpu")
        program = strata_compile(module, inputs, device="sim")
        with profiling() as kernels:
            program(*inputs)
        gpu, why = gpu_columns(program, kernels)
        for name, prof in kernels.items():
            a = prof.accesses
            cells = [f"{a[k].ratio:.2f}" if a[k].requests else "-" for k in
                     ("global load", "global store", "shared load", "shared store")]
            read = a["global load"].bytes / prof.minimum_read if prof.minimum_read else 0
            wrote = a["global store"].bytes / prof.minimum_written if prof.minimum_written else 0
            regs, spills, occ, est = gpu[name]
            print(f"{c.name:<36} {name:<24} {cells[0]:>5} {cells[1]:>5} {cells[2]:>7} "
                  f"{cells[3]:>7} {read:5.2f}x {wrote:6.2f}x {regs:>4} {spills:>6} {occ:>16} "
                  f"{est:>6}" + (f"  ({why})" if why else ""), flush=True)


if __name__ == "__main__":
    main()
