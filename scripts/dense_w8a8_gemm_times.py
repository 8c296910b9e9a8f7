"""Time the Gluon W8A8 GEMM alone (activations quantised beforehand, untimed) on each dense
projection of one `dsv4-flash-tp2` layer under several of its settings, beside DeepGEMM's
GEMM on the same quantised operands where it is installed, to see where the GEMM itself
stands against the leading FP8 kernel (the bench's layer rows add the quantiser, the same for
both, and o_a's concatenation).

    python scripts/dense_w8a8_gemm_times.py OUT.csv [M ...] [--settings default ...]
                                            [--proj q_up ...] [--rounds R]
                                                                 (default M: 4096 16384)

With --rounds, each projection's settings are timed R times in turn, so a slow spell of the
GPU falls on all of them; the table gives each setting's median.

Each setting is checked first against the W8A8 reference; times are medians of CUDA-graph
replays by the workbench's timer. A developer's tool, like dense_projection_times.py.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from dense_w8a16_gemm_times import gpu_layer, saved_table  # scripts/: on the path

import kernels.dense as dense
from kernels.dense.w8a8_wgmma import gemm_w8a8_wgmma
from kernels.dense.w8a8_wide import gemm_w8a8_wide
from kernels.fp8_quant import quantize_activations
from workbench.capture.timing import time_launch
from workbench.peers import deepgemm
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import activations

# name: gemm_w8a8_wgmma options (block_m, block_n, num_stages, ring_scales; none: its defaults)
SETTINGS = {
    "default": {},
    "m128s5": dict(block_m=128, num_stages=5),
    "m256s4": dict(block_m=256, num_stages=4),
    # a ring of three two-wave slots (144 of 227 KB): what shared memory it leaves for a second
    # staging buffer a warpgroup and the scales, if the load warp keeps it fed
    "m256s3": dict(block_m=256, num_stages=3),
    # and its row scales by TMA with each slot, read from shared memory (`ring_scales`)
    "m256s3r": dict(block_m=256, num_stages=3, ring_scales=True),
    # and a tile's weight scales staged in shared memory, loaded a tile ahead
    "m256s3rw": dict(block_m=256, num_stages=3, ring_scales=True, staged_weight_scales=True),
    # 64-wide tiles: twice the tiles, for projections whose 128-wide ones leave a last round
    # mostly idle (shared_gate_up at M=4096: 288 tiles on 132 SMs)
    "m256n64s5": dict(block_m=256, block_n=64, num_stages=5),
    "m128n64s6": dict(block_m=128, block_n=64, num_stages=6),
}
# name: gemm_w8a8_wide options: 128 x 192 tiles (kernels/dense/w8a8_wide.py), for the GEMMs
# whose 128-wide tiles leave a last round of SMs mostly idle (shared_gate_up at M=4096)
WIDE_SETTINGS = {
    "w192s4": dict(num_stages=4),
    "w192s3": dict(num_stages=3),
}


def deepgemm_gemm(values: torch.Tensor, scales: torch.Tensor, weights) -> torch.Tensor:
    """DeepGEMM's FP8 GEMM on operands quantised as the workbench's (row-fastest scales)."""
    import deep_gemm

    y = torch.empty(values.shape[0], weights.out_features, dtype=torch.bfloat16,
                    device=values.device)  # fmt: skip
    deep_gemm.fp8_gemm_nt((values, scales), (weights.values, weights.scales.contiguous()), y,
                          disable_ue8m0_cast=True)  # fmt: skip
    return y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("m", type=int, nargs="*", default=[4096, 16384])
    parser.add_argument("--settings", nargs="+", choices=[*SETTINGS, *WIDE_SETTINGS],
                        default=[*SETTINGS, *WIDE_SETTINGS],
                        help="the settings to time (default: all)")  # fmt: skip
    parser.add_argument("--proj", nargs="+", help="the projections to time (default: all)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the settings this many times, alternated")  # fmt: skip
    args = parser.parse_args()
    device, layer = gpu_layer()
    kernels = {name: partial(gemm, out_dtype=torch.bfloat16, **options)
               for gemm, settings in ((gemm_w8a8_wgmma, SETTINGS),
                                      (gemm_w8a8_wide, WIDE_SETTINGS))
               for name, options in settings.items() if name in args.settings}  # fmt: skip
    if deepgemm.available()[0]:
        kernels["deepgemm"] = deepgemm_gemm
    rows = []
    for m in args.m:
        xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
        first = 0
        for p in layer.projections:
            weights = layer.fp8[0][first]  # a group's first member: its members share a shape
            first += p.count
            if args.proj and p.name not in args.proj:
                continue
            x = xs[p.k * p.count][:, : p.k].contiguous()
            values, scales = quantize_activations(x, 128, outer_major=True)
            want = dense.w8a8_reference(x, weights)
            for round_ in range(args.rounds):
                for name, gemm in kernels.items():
                    row = {"m": m, "proj": p.name, "n": p.n, "k": p.k, "setting": name,
                           "round": round_}  # fmt: skip
                    try:
                        call = partial(gemm, values, scales, weights)
                        row["rel_error"] = relative_error(call(), want)
                        row["ms"] = time_launch(call, device, m, graph=True).median_ms
                        row["tflops"] = 2 * m * p.n * p.k / row["ms"] / 1e9
                    except Exception as err:  # noqa: BLE001 (a failing setting is a result)
                        row["status"] = f"{type(err).__name__}: {str(err)[:100]}"
                    print(row, flush=True)
                    rows.append(row)
    table = saved_table(rows, args.out)
    print(table.pivot_table(index=["m", "proj"], columns="setting", values="ms",
                            aggfunc="median").round(4))  # fmt: skip


if __name__ == "__main__":
    main()
