"""The program that `ncu` relaunches: build inputs, check, warm up, then one marked launch each.

ncu 2025.3 cannot attach to a running process, so `workbench.capture.ncu` starts this module
under `ncu` in a subprocess (as tritonbench does):

    python -m workbench.capture.ncu_target --kernel moe --variant stock --tokens 6 4096

For every token count it builds the inputs at one rank's shapes (preset `dsv4-flash-tp2`),
checks the variant against its torch reference (a wrong kernel is never profiled: exit status 2
and a message), warms up (Triton compiles), and only then runs exactly one launch of the variant
inside an NVTX push/pop range named by `range_name`, e.g. `wb:moe:stock:T=6`.

NVTX: the ranges are torch.cuda.nvtx push/pop ranges, so the GPU machine needs no `nvtx`
package; torch has no domain API, so they sit in NVTX's default domain (not a workbench domain).
ncu selects one with `--nvtx --nvtx-include "wb:moe:stock:T=6/"`: in ncu's filter syntax a
trailing `/` marks a push/pop range of the default domain (the bare name would mean a start/end
range), and several `--nvtx-include` options select any of their ranges. Range names therefore
avoid ncu's filter quantifiers `@ , [ ] / * +` (the `\\` escape is not worth the risk).

Kernels are registered in `ncu_builders.BUILDERS` (moe, dense, model-decode-step): a builder
turns the parsed arguments (`ncu_args`) into Workloads. Imports torch, the kernels and the
model only: no plotly and no nvtx package, which the GPU machine lacks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import torch

from workbench.capture.code_versions import check_kernels_from
from workbench.capture.ncu_args import DONE, PREFIX, Mark, TargetArgs, parse_args
from workbench.capture.ncu_builders import BUILDERS
from workbench.capture.ncu_workload_parts import device_for, release_cached_memory, synchronize
from workbench.errors import WorkbenchError


# ---- the run ---------------------------------------------------------------------------------
def run_target(
    args: TargetArgs, mark: Mark = torch.cuda.nvtx.range, log: Callable[[str], None] = print
) -> list[str]:
    """Check every workload, warm all up, then run each once inside `mark`; return the names.

    Every check comes first, so a kernel wrong at any size fails before anything is profiled.
    """
    args.validate()
    device = device_for(args.device)
    workloads = BUILDERS[args.kernel](args)
    for w in workloads:
        w.check()
        log(f"{PREFIX} {w.name} matches its reference")
    release_cached_memory(device)
    for w in workloads:
        w.warmup()
    synchronize(device)
    for w in workloads:
        w.run(mark)
        synchronize(device)
    return [w.name for w in workloads]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_kernels_from()  # `workbench ncu --code`: the package asked for, or nothing
        names = run_target(args)
    except WorkbenchError as err:
        print(f"{PREFIX} error: {err}", file=sys.stderr, flush=True)
        return 2
    print(f"{DONE}: ran {', '.join(names)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
