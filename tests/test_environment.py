"""What a capture records of the machine it ran on (`capture.environment`), and how the report
names the card, so two runs on the same H200 can be told from runs on two."""

import types
from pathlib import Path

import torch

from workbench.analysis.cards import card
from workbench.analysis.collection import Artifact
from workbench.capture import environment
from workbench.report.page import sources

UUID = "GPU-3dfce461-e036-83c3-cb09-1235c1ef9565"


def test_the_gpu_record_keeps_nvidia_smi_fields_and_the_cards_uuid(monkeypatch):
    """A GPU machine without the GPU: torch's device queries and nvidia-smi's answer faked."""
    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0,
                                  multi_processor_count=132, total_memory=150 * 2**30)  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(environment.shutil, "which", lambda name: name)
    queries = []

    def nvidia_smi(cmd: list[str]) -> str:
        queries.append(cmd)
        return f"580.159.04, 1980 MHz, 1980 MHz, 3201 MHz, 700.00 W, 35, {UUID}"

    monkeypatch.setattr(environment, "_run", nvidia_smi)
    gpu = environment._gpu()
    assert gpu["uuid"] == UUID and gpu["power.limit"] == "700.00 W" and gpu["sms"] == 132
    assert queries[0][1].endswith(",uuid")
    assert card({"environment": {"gpu": gpu}}) == "3dfce461"


def test_a_card_is_named_only_where_the_artifact_recorded_one():
    assert card({"environment": {"gpu": {"uuid": UUID.upper()}}}) == "3dfce461"
    assert card({"environment": {"gpu": {"name": "NVIDIA H200"}}}) is None
    assert card({"environment": {"gpu": {"uuid": "not a uuid"}}}) is None
    assert card({}) is None


def test_a_tables_sources_name_the_card_beside_gpu_and_commit():
    recorded = {"environment": {"gpu": {"name": "NVIDIA H200", "uuid": UUID},
                                "git": {"commit": "0857594"}}}  # fmt: skip
    older = {"environment": {"gpu": {"name": "NVIDIA H200"}, "git": {"commit": "04fc4b4"}}}
    text = sources([Artifact(Path("raw/new"), "bench-moe", recorded, None),
                    Artifact(Path("raw/old"), "bench-moe", older, None)])  # fmt: skip
    assert text == (
        "From `raw/new` (NVIDIA H200, card 3dfce461, commit 0857594); "
        "`raw/old` (NVIDIA H200, commit 04fc4b4)."
    )
