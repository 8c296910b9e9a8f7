"""NVIDIA's `ncu_report` module, or an error that says how to get it.

Every reader of Nsight Compute reports imports it from here, so a machine without it (the
GPU machine's image lacks it; it is an optional extra here) gets the fix instead of a
traceback, and before `workbench ncu` spends minutes capturing a report it cannot read.
"""

from workbench.errors import MissingDependency

try:
    import ncu_report
except ImportError as missing:
    raise MissingDependency(
        "Reading Nsight Compute reports needs NVIDIA's ncu_report module, which is not "
        "installed: `pip install 'moe-workbench[ncu]'` (or `pip install ncu-report`), or put "
        "Nsight Compute's extras/python folder on PYTHONPATH.",
        name="ncu_report",
    ) from missing

__all__ = ["ncu_report"]
