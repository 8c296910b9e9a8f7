"""The report's cells: a number is rounded by the unit its column's header names (times to 3
significant digits, ratios to 2 decimals, percentages to 1, errors in scientific notation),
and raw column names become headers a reader can read, with their units."""

from __future__ import annotations

import math

import pytest

from workbench.report.cells import format_column, human_header


@pytest.mark.parametrize(
    ("header", "values", "shown"),
    [
        ("MoE (ms)", [5205.53, 15.084, 0.10449, 0.0025], ["5,206", "15.1", "0.104", "0.00250"]),
        ("mean (us)", [195.968, 1.76], ["196", "1.76"]),
        ("decode, 1 stream (tokens/s)", [80893.1, 241.06], ["80,893", "241"]),
        ("fp8 TFLOP/s", [0.523, 144.2], ["0.523", "144"]),
        ("bf16 x floor", [1.2345, 42.72, 551.54], ["1.23", "42.72", "552"]),
        ("b / a", [0.98765], ["0.99"]),
        ("share (%)", [40.139, 100.0], ["40.1", "100.0"]),
        ("rel. error vs bf16", [0.0297, 0.0017, 0.0], ["3.0e-02", "1.7e-03", "0"]),
        ("registers", [127.0, math.nan], ["127", ""]),
        ("tokens", [33863, 6], ["33,863", "6"]),
        ("status", ["ok", "error: Timeout"], ["ok", "error: Timeout"]),
        ("stock (ms)", ["0.334 (spills)", 0.367], ["0.334 (spills)", "0.367"]),
    ],
)
def test_numbers_are_rounded_by_the_unit_in_the_header(header, values, shown):
    assert format_column(values, header) == shown


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("time_ms", "time (ms)"),
        ("share_pct", "share (%)"),
        ("duration_us", "duration (us)"),
        ("tokens_per_s", "tokens/s"),
        ("ratio_to_floor", "× floor"),
        ("ratio_to_cublas", "× cuBLAS"),
        ("error_vs_bf16", "rel. error vs bf16"),
        ("rel_error", "rel. error"),
        ("weight_dtype", "weight dtype"),
        ("top_stall", "top stall"),
        ("Duration (us)", "Duration (us)"),  # already a header: left alone
    ],
)
def test_raw_column_names_become_headers_with_units(name, header):
    assert human_header(name) == header
