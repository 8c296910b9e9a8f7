"""Packaging by layer: a core that reads artifacts, extras for the layers above it.

pyproject.toml's core dependencies are what reading artifacts needs, so a box without torch or
plotly installs the package and loads committed runs; `all` is what `./dev` installs and
environment.yml mirrors it for conda users (no conda here to solve it). The import test runs
the analysis layer with the extras' modules blocked, as on a core-only install.
"""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
# What `all` must bring: every layer the workbench itself uses. `peers` (other projects'
# kernels, GPU only) stays out so that `./dev` on a CPU box never builds them.
ALL_LAYERS = {"capture", "ncu", "notebook", "test"}
# Import names of the extras' modules; a core install has none of them.
EXTRA_MODULES = (
    "torch", "triton", "nvtx", "tqdm", "ncu_report", "plotly", "ipywidgets", "anywidget",
    "jupyterlab", "nbconvert", "nbclient", "nbformat", "jinja2", "ipykernel",
)  # fmt: skip


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def _name(requirement: str) -> str:
    """The distribution name of a requirement, normalised as PyPI does (PEP 503)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def _included_extras(extra: str) -> set[str]:
    """The extras that `extra` names through `moe-workbench[...]`, followed transitively."""
    found: set[str] = set()
    for requirement in EXTRAS[extra]:
        if _name(requirement) != _name(PROJECT["name"]):
            continue
        for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
            inner = inner.strip()
            found |= {inner} | _included_extras(inner)
    return found


def _requirements(extra: str) -> set[str]:
    """The third-party requirements of an extra, without its references to other extras."""
    return {_normalise(r) for r in EXTRAS[extra] if _name(r) != _name(PROJECT["name"])}


def test_all_holds_every_layer_but_peers():
    assert _included_extras("all") == ALL_LAYERS
    assert "peers" in EXTRAS and "peers" not in _included_extras("all")
    assert not _requirements("all"), "`all` only names other extras"


def test_core_is_only_what_reading_artifacts_needs():
    core = {_name(r) for r in PROJECT["dependencies"]}
    assert {"pandas", "numpy"} <= core
    heavy = {_name(r) for extra in ALL_LAYERS - {"test"} for r in EXTRAS[extra]}
    assert not core & heavy, f"{core & heavy} belong to an extra, not the core"


def test_environment_yml_agrees_with_pyproject():
    wanted = {_normalise(r) for r in PROJECT["dependencies"]}
    for extra in _included_extras("all"):
        wanted |= _requirements(extra)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    (pip_section,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == wanted
    assert any(d.startswith("python") for d in env["dependencies"] if isinstance(d, str))


# Run in a fresh interpreter: a finder blocks the extras' modules (as if not installed), then
# the core modules are imported and, where one is committed, a profile is loaded. It prints
# what could not be imported and which distributions the imported modules came from.
CORE_ONLY = """
import importlib, importlib.abc, importlib.metadata, json, sys
BEFORE = set(sys.modules)  # what site-packages' .pth files loaded at startup is not ours
BLOCKED = set(sys.argv[1].split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Block())
failed = {}
for module in json.loads(sys.argv[2]):
    try:
        importlib.import_module(module)
    except ImportError as err:
        failed[module] = err.name
if sys.argv[3]:
    import workbench
    assert len(workbench.load(sys.argv[3]).kernels) > 0
tops = {m.partition(".")[0] for m in set(sys.modules) - BEFORE} - set(sys.stdlib_module_names)
owners = importlib.metadata.packages_distributions()
print(json.dumps({"failed": failed, "dists": sorted({d for t in tops for d in owners.get(t, [])})}))
"""


def _core_modules() -> list[str]:
    """The modules reading artifacts needs: the facade, artifacts and every analysis module."""
    analysis = [
        f"workbench.analysis.{m.name}"
        for m in pkgutil.iter_modules([str(ROOT / "workbench" / "analysis")])
    ]
    return ["workbench", "workbench.errors", "workbench.presets", "workbench.artifacts",
            "workbench.analysis", *analysis]  # fmt: skip


def _closure(names: set[str]) -> set[str]:
    """Distributions `names` need, transitively (requirements behind an extra left out)."""
    from importlib.metadata import PackageNotFoundError, requires

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = _name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [r for r in needs if "extra ==" not in r and "extra==" not in r]
    return seen


def test_artifacts_and_analysis_import_without_the_extras():
    profiles = (ROOT / "raw").glob("profile-*/")
    smallest = min(profiles, key=lambda p: sum(f.stat().st_size for f in p.iterdir()), default="")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            CORE_ONLY,
            ",".join(EXTRA_MODULES),
            json.dumps(_core_modules()),
            str(smallest),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    # Only the Nsight Compute modules may need a module of an extra, and only ncu_report.
    for module, missing in report["failed"].items():
        assert module.startswith("workbench.analysis.ncu") and missing == "ncu_report", (
            f"{module} needs {missing}, which a core install lacks"
        )
    assert "workbench.analysis.ncu" in report["failed"], "the blocker did not block ncu_report"
    allowed = _closure({_name(r) for r in PROJECT["dependencies"]}) | {_name(PROJECT["name"])}
    outside = {_name(d) for d in report["dists"]} - allowed
    assert not outside, f"reading artifacts imported {outside}, which the core does not install"


@pytest.mark.parametrize("extra", sorted(ALL_LAYERS | {"peers"}))
def test_every_extra_is_documented(extra):
    assert f".[{extra}]" in (ROOT / "docs" / "install.md").read_text()
