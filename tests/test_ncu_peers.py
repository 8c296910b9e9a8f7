"""Peers as ncu targets, on the CPU with stand-in peers: converted once from the weights bench
hands them, checked, then marked one launch per token count; every refusal names its fix."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, real_reports, report_as_written
from test_ncu_capture import FakeNcu, Marks, cpu_args, fake_machine  # noqa: F401 (a fixture)

import kernels.dense as dense
from kernels.moe import moe_reference
from workbench.capture.code_versions import (
    CACHE,
    KERNELS_FROM_ENV,
    check_kernels_from,
    code_version,
    package_environment,
)
from workbench.capture.ncu import capture, ncu_command
from workbench.capture.ncu_args import DONE, TargetArgs
from workbench.capture.ncu_peers import peer_record
from workbench.capture.ncu_target import run_target
from workbench.capture.ncu_workload_parts import dense_projection
from workbench.errors import WorkbenchError
from workbench.peers import PEER_BLOCK, PEERS, Peer


def _dense_peer(converted: list, scale: float = 1.0, ok: bool = True) -> Peer:
    """A dense peer computing the reference on what it was handed (times `scale`), that
    records each weight it converts."""

    def prepare(weights):
        converted.append(weights)
        return lambda x: (dense.linear_reference(x, weights) * scale).to(x.dtype)

    why = "fakegemm 1.2" if ok else "fakegemm is not installed"
    return Peer("fakegemm", ("dense",), "w8a8-block128", "w8a8", lambda: (ok, why), prepare)


def _moe_peer(converted: list) -> Peer:
    def prepare_moe(weights):
        converted.append(weights)
        return lambda x, ids, route: moe_reference(x, ids, route, weights).to(x.dtype)

    return Peer("fakemoe", ("moe",), "", "w8a8", lambda: (True, "fakemoe 0.1"),
                prepare_moe=prepare_moe, moe_variant="masked + torch glue")  # fmt: skip


def _marked_once_per_size(kernel: str, peer: str, tokens: tuple[int, ...], **params) -> None:
    """The peer's target on the CPU checks, then marks one launch per size, in order."""
    marks, names = Marks(), [f"wb:{kernel}:{peer}:T={t}" for t in tokens]
    args = cpu_args(kernel, peer, tokens, **params)
    assert run_target(args, marks, log=lambda line: None) == names == marks.names


def test_a_dense_peer_is_converted_once_checked_then_marked_once_per_m(monkeypatch):
    converted = []
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer(converted))
    _marked_once_per_size("dense", "fakegemm", (1, 20), projection="qkv_a")
    # one conversion, of the projection's weight as FP8 in DeepSeek's blocks, as bench hands it
    assert len(converted) == 1
    (weight,) = converted
    assert weight.fmt == "fp8" and weight.block == PEER_BLOCK
    qkv_a = dense_projection("tiny", "qkv_a")
    assert (weight.out_features, weight.in_features) == (qkv_a.n, qkv_a.k)


def test_a_wrong_peer_is_not_profiled(monkeypatch):
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer([], scale=1.5))
    with pytest.raises(WorkbenchError, match="fakegemm:T=1: output differs from its reference"):
        run_target(cpu_args("dense", "fakegemm", (1,)), Marks(), log=lambda line: None)


def test_a_peer_that_cannot_run_says_why(monkeypatch):
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer([], ok=False))
    with pytest.raises(WorkbenchError, match="dense peer 'fakegemm' cannot run here: fakegemm is "
                       "not installed"):  # fmt: skip
        run_target(cpu_args("dense", "fakegemm", (1,)), Marks())
    # a placeholder has no adapter: it says what would make it work
    ok, why = PEERS["marlin"].available()
    assert not ok
    with pytest.raises(WorkbenchError, match="dense peer 'marlin' cannot run here"):
        run_target(cpu_args("dense", "marlin", (1,)), Marks())


def test_a_peer_takes_the_weights_bench_gives_it_and_no_other_settings(monkeypatch):
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer([]))
    with pytest.raises(WorkbenchError, match="runs block=128 only .* drop block=32"):
        run_target(cpu_args("dense", "fakegemm", (1,), block=32), Marks())
    with pytest.raises(WorkbenchError, match="no parameter block_n; its parameters: projection, "
                       "block"):  # fmt: skip
        run_target(cpu_args("dense", "fakegemm", (1,), block_n=32), Marks())
    with pytest.raises(WorkbenchError, match="unknown projection=qkv; the layer's are qkv_a"):
        run_target(cpu_args("dense", "fakegemm", (1,), projection="qkv"), Marks())
    with pytest.raises(WorkbenchError, match="moe peer 'deepgemm' runs fmt=fp8 only"):
        run_target(cpu_args("moe", "deepgemm", (1,), fmt="int4"), Marks())
    # an unknown variant's message names the peers too
    with pytest.raises(WorkbenchError, match="unknown dense variant 'nope'; known: .*; peers: "
                       "cublas_fp8, humming, humming_w4a16, deepgemm"):  # fmt: skip
        run_target(cpu_args("dense", "nope", (1,)), Marks())


def test_a_moe_peer_runs_its_layer_on_fp8_experts(monkeypatch):
    converted = []
    monkeypatch.setitem(PEERS, "fakemoe", _moe_peer(converted))
    _marked_once_per_size("moe", "fakemoe", (3, 5), fmt="fp8")
    (experts,) = converted
    assert experts.fmt == "fp8" and experts.block == PEER_BLOCK


def test_what_a_peer_capture_records(monkeypatch):
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer([]))
    assert peer_record("dense", "fakegemm") == {
        "name": "fakegemm", "variant": "w8a8-block128", "scheme": "w8a8", "available": True,
        "why": "fakegemm 1.2",
    }  # fmt: skip
    assert peer_record("dense", "w8a16") is None
    assert peer_record("moe", "stock") is None
    monkeypatch.setitem(PEERS, "fakemoe", _moe_peer([]))
    assert peer_record("moe", "fakemoe")["variant"] == "masked + torch glue"


@pytest.mark.parametrize("report", real_reports()[:1] or [None])
def test_a_peer_capture_writes_the_peer_into_its_metadata(fake_machine, tmp_path, monkeypatch,  # noqa: F811
                                                          report):  # fmt: skip
    if report is None:
        pytest.skip("needs a real .ncu-rep (none committed under ncu/ yet) to stand for ncu's")
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer([]))
    fake = fake_machine(FakeNcu(f"{DONE}: ran\n", report=report_as_written(report)))
    path = capture("dense", "fakegemm", [4096], out=tmp_path / "ncu", projection="o_b")
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["variant"] == "fakegemm" and meta["params"] == {"projection": "o_b"}
    # no --code: the working tree's kernels, whatever code this process was told to check
    assert fake.kwargs["env"][KERNELS_FROM_ENV] == ""
    assert meta["peer"]["why"] == "fakegemm 1.2" and meta["peer"]["available"] is True


def test_a_moe_peer_s_range_is_profiled_whole():
    """The MoE kernel-name filter keeps the workbench's Triton kernels; a peer's GEMMs have
    names of their own, so its range goes unfiltered."""
    ours = ncu_command("ncu", Path("out"), TargetArgs("moe", "flat", (6,)), python="python")
    theirs = ncu_command("ncu", Path("out"), TargetArgs("moe", "deepgemm", (6,)), python="python")
    assert "--kernel-name" in ours and "--kernel-name" not in theirs


@pytest.mark.parametrize("report", real_reports()[:1] or [None])
def test_a_capture_of_other_code_runs_its_target_on_that_package(fake_machine, tmp_path,  # noqa: F811
                                                                 monkeypatch, report):  # fmt: skip
    """`code=` profiles another kernels package: ncu's target imports it (PYTHONPATH first,
    PYTHONSAFEPATH against the working directory), the report is named and recorded by it."""
    if report is None:
        pytest.skip("needs a real .ncu-rep (none committed under ncu/ yet) to stand for ncu's")
    folder = tmp_path / "before"
    shutil.copytree(ROOT / "kernels", folder / "kernels", ignore=shutil.ignore_patterns(CACHE))
    (folder / "kernels" / "which.py").write_text("print('the folder arm')\n")

    class Seeing(FakeNcu):  # what ncu would find on the target's path when it starts
        def __call__(self, command, **kwargs):
            first = Path(kwargs["env"]["PYTHONPATH"].split(os.pathsep)[0])
            self.found = first.is_absolute() and (first / "kernels" / "which.py").is_file()
            return super().__call__(command, **kwargs)

    fake = fake_machine(Seeing(f"{DONE}: ran\n", report=report_as_written(report)))
    monkeypatch.chdir(tmp_path)  # a relative out, from outside the repository: ncu runs there
    path = capture("dense", "w8a16", [64], out="ncu", code=str(folder))
    assert fake.found  # the exported package, by a path that holds wherever ncu runs
    version = code_version(str(folder))
    assert path.name == f"dense-w8a16-T64-code{version.key}.ncu-rep"
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["code"] == {"code": "folder", "folder": "before", "digest": version.digest}
    env = fake.kwargs["env"]
    assert env["PYTHONSAFEPATH"] == "1"
    assert Path(env["PYTHONPATH"].split(os.pathsep)[0]).name == version.key
    # the target's Triton cache lies beside the exported package, in the folder removed below
    assert Path(env["TRITON_CACHE_DIR"]).parent == Path(env[KERNELS_FROM_ENV]).parent
    assert path.parent == tmp_path / "ncu"
    assert not list((tmp_path / "ncu").glob(".*"))  # the exported package went with the rest


def test_under_a_package_s_environment_python_m_imports_that_package(tmp_path):
    """What ncu's target runs under for `code=`: a `python -m` process started in the
    repository imports the folder's package, not the repository's own."""
    folder = tmp_path / "before"
    shutil.copytree(ROOT / "kernels", folder / "kernels", ignore=shutil.ignore_patterns(CACHE))
    (folder / "kernels" / "which.py").write_text("print('the folder arm')\n")
    probe = [sys.executable, "-m", "kernels.which"]
    moved = package_environment(folder)
    done = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **moved})  # fmt: skip
    assert done.stdout.strip() == "the folder arm", done.stderr
    # its kernels compile into a cache of their own, beside the package and gone with it
    assert Path(moved["TRITON_CACHE_DIR"]).parent == tmp_path
    assert subprocess.run(probe, cwd=ROOT, capture_output=True).returncode != 0


def test_a_capture_of_code_that_is_not_there_is_refused_before_ncu(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: pytest.fail("looked for ncu"))
    with pytest.raises(WorkbenchError, match="code='no-such-rev' is neither 'worktree'"):
        capture("dense", "w8a16", [64], out=tmp_path, code="no-such-rev")


def test_a_peer_that_cannot_run_is_refused_before_ncu(monkeypatch, tmp_path):
    monkeypatch.setitem(PEERS, "fakegemm", _dense_peer([], ok=False))
    monkeypatch.setattr(shutil, "which", lambda name: pytest.fail("looked for ncu"))
    with pytest.raises(WorkbenchError, match="dense peer 'fakegemm' cannot run here: fakegemm "
                       "is not installed"):  # fmt: skip
        capture("dense", "fakegemm", [64], out=tmp_path)
    with pytest.raises(WorkbenchError, match="moe peer 'vllm_fused_moe' cannot run here"):
        capture("moe", "vllm_fused_moe", [6], out=tmp_path)  # a placeholder


def test_a_target_refuses_kernels_from_anywhere_but_the_code_asked_for(monkeypatch, tmp_path):
    """ncu's target checks which `kernels` it imported against the folder `--code` laid out,
    so a wrong path or working directory fails instead of profiling the working tree's."""
    monkeypatch.setenv(KERNELS_FROM_ENV, str(tmp_path / "before"))
    with pytest.raises(WorkbenchError, match="imported kernels from .*, not from .*before"):
        check_kernels_from()
    monkeypatch.setenv(KERNELS_FROM_ENV, str(ROOT))  # where this process's kernels came from
    check_kernels_from()
    monkeypatch.delenv(KERNELS_FROM_ENV)
    check_kernels_from()  # no code asked for: nothing to check
