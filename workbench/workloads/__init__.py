"""The one workload contract: every problem the workbench times is built here, once.

`profile`, `bench`, `sweep`, `ab`, `ncu` and the tuning scripts all build their inputs through
these builders, seeded by one rule (`seeds.derive`), checked against one reference with one
tolerance table (`checks`), so "stock, T=6, uniform, seed 0" is the same routing, the same
activations and the same weights wherever it runs, and numbers from different tools can be
set side by side.
"""
