"""A set of Nsight Compute reports read as one: launches by variant, token count and role, the
seed's table over files, and one variant against another. On stand-ins for ncu_report's
objects, then on every real report under ncu/ (skipped until the GPU machine's are committed)."""

import pytest
from helpers import real_reports, stand_in_reports

from workbench.analysis.ncu_catalog import (
    SEED_ROWS,
    SERVED_FORMAT,
    NcuCatalog,
    role,
    variant_label,
)
from workbench.capture.profile_settings import SERVED_ON_GPU
from workbench.errors import ArtifactError, WorkbenchError
from workbench.report.ncu_page import CATALOG_FIGURE_KINDS, catalog_figure
from workbench.report.seed_tables import kernel_variants
from workbench.views.ncu import NcuCatalogResult


@pytest.fixture
def catalog() -> NcuCatalog:
    return NcuCatalog(stand_in_reports())


def test_roles_pair_the_steps_of_different_schedulers():
    assert role("_stock_gate_up_kernel") == role("_flat_gate_up_kernel") == "gate_up"
    assert role("_multirow_down_kernel") == "down"
    assert role("_counts_kernel") == "counts"
    assert role("vectorized_elementwise_kernel") == "vectorized_elementwise"


def test_launches_know_their_variant_tokens_and_share_of_the_call(catalog):
    assert catalog.variants == ["stock", "flat"]
    assert catalog.tokens("stock") == [6, 4096] and catalog.tokens("flat") == [6]
    launches = catalog.launches()
    assert launches.groupby(["file", "tokens"])["share_pct"].sum().round(6).eq(100).all()
    assert list(launches.loc[~launches["main"], "role"]) == ["counts"] * 3  # 1 us of ~62
    entries = catalog.entries().set_index("variant")
    assert entries.loc["stock", "tokens"] == "6, 4096" and entries.loc["flat", "format"] == "fp8"
    assert entries.loc["flat", "gpu"] == "NVIDIA H200" and entries.loc["flat", "ncu"] == "2025.3.1"


def test_the_seed_table_spans_files_and_token_counts(catalog):
    table = catalog.seed_table("stock")
    assert list(table.index) == list(SEED_ROWS)
    assert list(table.columns) == [
        "6 tokens, gate_up", "6 tokens, down", "4096 tokens, gate_up", "4096 tokens, down",
    ]  # fmt: skip
    assert table.loc["Duration (us)", "4096 tokens, gate_up"] == pytest.approx(123.0)
    assert table.loc["DRAM throughput (%)", "6 tokens, down"] == pytest.approx(9.0)
    assert table.loc["Top stall, cycles per issued instruction", "6 tokens, gate_up"] == (
        "barrier 1.61"
    )
    assert table.loc["Registers per thread"].eq(128).all()


def test_stalls_occupancy_and_hotspots_per_main_launch(catalog):
    stalls = catalog.stalls("stock")
    launches = list(dict.fromkeys(stalls.columns.get_level_values(0)))
    assert launches == list(catalog.seed_table("stock").columns)
    shares = stalls.xs("share_pct", axis=1, level=1)
    assert shares.sum().round(6).eq(100).all()
    assert catalog.occupancy("stock").loc["Limiter"].eq("registers, warps").all()
    hot = catalog.hotspots("flat", 6, n=2)
    assert list(hot["launch"]) == ["6 tokens, gate_up"] * 2 + ["6 tokens, down"] * 2
    for kind in CATALOG_FIGURE_KINDS:
        assert catalog_figure(catalog, kind, "stock").data
    drawn = NcuCatalogResult(catalog.reports).figure("seed", "stock")
    assert drawn.to_json() == catalog_figure(catalog, "seed", "stock").to_json()
    with pytest.raises(WorkbenchError, match="unknown figure kind 'roofline'; known: seed"):
        catalog_figure(catalog, "roofline")


def test_flat_against_stock_launch_by_launch(catalog):
    diff = catalog.diff("flat", "stock")
    assert list(dict.fromkeys(diff.columns.get_level_values(0))) == [
        "6 tokens, gate_up", "6 tokens, down",
    ]  # fmt: skip
    assert list(diff.columns.get_level_values(1)[:3]) == ["stock", "flat", "change_pct"]
    gate_up = diff["6 tokens, gate_up"]
    assert gate_up.loc["Duration (us)", "stock"] == pytest.approx(41.0)
    assert gate_up.loc["Duration (us)", "flat"] == pytest.approx(32.8)
    assert gate_up.loc["Duration (us)", "change_pct"] == pytest.approx(-20.0)
    assert gate_up.loc["Registers per thread", "change_pct"] == 0


def test_clear_errors(catalog, tmp_path):
    with pytest.raises(WorkbenchError, match="no report of variant 'padded'"):
        catalog.seed_table("padded")
    only_stock = NcuCatalog(stand_in_reports()[:1])
    with pytest.raises(WorkbenchError, match="no report of variant 'flat'"):
        only_stock.diff("flat", "stock")
    with pytest.raises(ArtifactError, match="workbench ncu moe stock --tokens 6 4096"):
        NcuCatalog.load(tmp_path)


def test_repeated_launches_get_numbered_columns():
    stock = stand_in_reports()[0]
    twice = NcuCatalog([stock, stock])
    columns = twice.seed_table("stock").columns
    assert len(set(columns)) == len(columns) == 8
    assert "6 tokens, gate_up #2" in columns


def test_one_variant_captured_on_two_gpus_gets_a_table_for_each():
    """The same GEMM captured on an H100 and an H200: two variants naming their card, never one
    table numbering the second card's launches `#2` beside the first's."""
    stock = stand_in_reports()[0]
    catalog = NcuCatalog([stock, stand_in_reports("NVIDIA H100 80GB HBM3")[0]])
    assert catalog.variants == ["stock on NVIDIA H200", "stock on NVIDIA H100 80GB HBM3"]
    assert list(catalog.entries()["variant"]) == catalog.variants
    for variant in catalog.variants:
        columns = list(catalog.seed_table(variant).columns)
        assert len(columns) == 4 and not any("#" in column for column in columns)
    same_card = NcuCatalog([stock, stand_in_reports()[1]])
    assert same_card.variants == ["stock", "flat"]  # one card: the labels stay as they were
    flat_first = NcuCatalog([stand_in_reports()[1], *catalog.reports])
    assert kernel_variants(flat_first) == [*catalog.variants, "flat"]  # the seed's order kept


@pytest.mark.skipif(not real_reports(), reason="no real Nsight Compute report under ncu/ yet")
def test_real_reports_give_the_seed_table():
    catalog = NcuCatalog.load(real_reports())
    assert "stock" in catalog.variants
    table = catalog.seed_table("stock")
    assert catalog.tokens("stock")  # the seed's 6 and 4096, as far as they are captured
    for tokens in catalog.tokens("stock"):
        assert {f"{tokens} tokens, gate_up", f"{tokens} tokens, down"} <= set(table.columns)
    assert table.loc["Registers per thread"].notna().all()
    if "flat" in catalog.variants:
        assert not catalog.diff("flat", "stock").empty


def test_variant_labels_keep_parameters_and_non_moe_kernels(tmp_path):
    path = tmp_path / "x.ncu-rep"
    assert variant_label({"variant": "multirow", "params": {"rows": 2, "fmt": "fp8"}}, path) == (
        "multirow rows=2"
    )
    decode = {"kernel": "model-decode-step", "variant": "stock", "params": {"layers": 1}}
    assert variant_label(decode, path) == "model-decode-step stock layers=1"
    assert variant_label({}, path) == "x"  # a foreign report: its file name
    # another format than the served FP8 is named, so flat's INT4 launches pair with no FP8 ones
    assert variant_label({"variant": "flat", "params": {"fmt": "int4"}}, path) == "flat fmt=int4"
    assert variant_label({"variant": "flat", "params": {"fmt": "fp8"}}, path) == "flat"
    assert SERVED_ON_GPU["moe_format"] == SERVED_FORMAT
