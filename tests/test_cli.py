"""The `workbench` command: tables, artifacts and HTML written; errors without tracebacks."""

import subprocess
import sys

import pytest
import torch

from workbench.cli import main
from workbench.cli.values import kernel_setting


def test_profile_prints_both_tables_and_writes_html(tmp_path, capsys):
    html = tmp_path / "report.html"
    code = main(
        [
            "profile",
            "--prompt-tokens",
            "300",
            "--decode-tokens",
            "2",
            "--param",
            "prefill_chunk=128",
            "--out",
            str(tmp_path / "raw"),
            "--html",
            str(html),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Prefill" in out and "Decode, per step (2 steps, eager launches)" in out
    assert "CPU run" in out
    assert html.stat().st_size > 1_000_000  # plotly.js is inlined
    (run_dir,) = (tmp_path / "raw").iterdir()
    assert (run_dir / "run.json").is_file()

    assert main(["show", str(run_dir), str(run_dir)]) == 0
    assert "Decode, per step (mean ms)" in capsys.readouterr().out


def test_user_errors_exit_2_with_one_clear_line(tmp_path, capsys):
    assert main(["trace", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: error: trace") and "Traceback" not in err
    assert main(["profile", "--prompt-tokens", "0", "--out", str(tmp_path)]) == 2
    assert "prompt_tokens=0 is below 1" in capsys.readouterr().err
    assert main(["show", str(tmp_path / "profile-gone")]) == 2
    err = capsys.readouterr().err
    assert "profile-gone does not exist; give a profile run's folder" in err


@pytest.mark.parametrize("kernel", ["dense", "moe", "attention"])
def test_bench_without_a_gpu_says_where_it_runs(kernel, monkeypatch, tmp_path, capsys):
    """A bench times kernels against the GPU's own ceilings: without one it says so in one
    line, names what runs here instead, and writes nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", kernel, "--no-peers", "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: error: no CUDA GPU is visible") and "Traceback" not in err
    assert "runs on the GPU machine" in err and "workbench report raw" in err
    assert not list(tmp_path.iterdir())


def test_ncu_without_ncu_report_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    """Before any capture starts: a report that cannot be read is not worth minutes of ncu."""
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # import ncu_report raises ImportError
    for name in [
        n for n in sys.modules if n.startswith(("workbench.analysis.ncu", "workbench.capture.ncu"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["ncu", "moe", "flat", "--tokens", "6", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs NVIDIA's ncu_report module" in err and "pip install" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_help_names_every_command():
    out = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "--help"], capture_output=True, text=True
    ).stdout
    for command in ("profile", "show", "trace", "ncu", "ncu-report"):
        assert command in out


def test_sweep_and_ab_from_the_command_line(tmp_path, capsys):
    small = ["--param", "experts=8", "--param", "top_k=2", "--param", "hidden=64",
             "--param", "expert_intermediate=32", "--param", "fmt=bf16"]  # fmt: skip
    run_dir = tmp_path / "sweep"
    code = main(["sweep", "moe", "num_stages", "1", "2", "--tokens", "3", "--baseline", "1",
                 "--param", "variant=stock", *small, "--run-dir", str(run_dir)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "Did not help?" in out and "num_stages=1 -> 2" in out
    assert (run_dir / "rows.jsonl").read_text().count("\n") == 2
    code = main(["ab", "moe", "--a", "variant=stock", "--b", "variant=flat", "--tokens", "3",
                 *small, "--run-dir", str(tmp_path / "ab")])  # fmt: skip
    assert code == 0 and "ratio" in capsys.readouterr().out


def test_kernel_switches_reach_the_kernel_as_python_values(tmp_path, capsys):
    """`wgmma=False` and `wgmma=None` arrive as False and None (moe_flat refuses the text
    'False'), so Gluon against Triton kernels is an A/B from the command line."""
    assert [kernel_setting(t)[1] for t in ("a=False", "a=true", "a=None", "a=3", "a=x")] == [
        False, True, None, 3, "x"
    ]  # fmt: skip
    small = ["--param", "experts=8", "--param", "top_k=2", "--param", "hidden=64", "--param",
             "expert_intermediate=32", "--param", "fmt=bf16", "variant=flat"]  # fmt: skip
    code = main(["ab", "moe", "--a", "wgmma=False", "--b", "wgmma=None", "--tokens", "3",
                 *small, "--run-dir", str(tmp_path / "ab")])  # fmt: skip
    assert code == 0 and "ratio" in capsys.readouterr().out


def test_ab_profile_passes_its_runs_per_arm(monkeypatch, capsys):
    import pandas as pd

    import workbench
    from workbench.analysis.experiments import AbResult

    seen = {}

    def fake_ab(a, b, tokens, **options):
        seen.update(a=a, b=b, tokens=tokens, **options)
        return AbResult({"kind": "ab"}, pd.DataFrame({"arm": ["a"], "tokens": [8],
                                                      "status": ["ok"]}))  # fmt: skip

    monkeypatch.setattr(workbench, "ab", fake_ab)
    argv = ["ab", "profile", "--a", "dense=w8a16", "--b", "dense=hybrid", "--tokens", "8"]
    assert main([*argv, "--runs", "3"]) == 0
    assert seen["runs"] == 3 and seen["a"] == {"dense": "w8a16"}
    seen.clear()
    assert main(argv) == 0 and "runs" not in seen  # ab's own default: PROFILE_RUNS
    capsys.readouterr()


def test_ncu_passes_code_and_peers_through(monkeypatch, capsys):
    """`workbench ncu dense deepgemm` and `--code REV` reach the capture as they are."""
    import workbench

    seen = {}

    class Report:
        def text(self) -> str:
            return "report"

    def fake_ncu(kernel, variant, tokens, out, **options):
        seen.update(kernel=kernel, variant=variant, tokens=tokens, **options)
        return Report()

    monkeypatch.setattr(workbench, "ncu", fake_ncu)
    argv = ["ncu", "dense", "w8a16", "--tokens", "64", "--param", "projection=q_up"]
    assert main([*argv, "--code", "HEAD~2"]) == 0
    assert seen["code"] == "HEAD~2" and seen["projection"] == "q_up" and seen["tokens"] == [64]
    assert main(["ncu", "dense", "deepgemm", "--tokens", "4096"]) == 0
    assert seen["variant"] == "deepgemm" and seen["code"] is None
    assert capsys.readouterr().out.count("report") == 2


def test_ncu_help_names_every_peer_that_runs():
    """The help lists the peers by hand (building it imports no peer); it must keep up."""
    from workbench.peers import PEERS

    out = subprocess.run([sys.executable, "-m", "workbench.cli", "ncu", "--help"],
                         capture_output=True, text=True).stdout  # fmt: skip
    text = " ".join(out.split())
    runnable = [n for n, p in PEERS.items() if p.prepare is not None or p.prepare_moe is not None]
    assert runnable and all(name in text for name in runnable), (runnable, text)
