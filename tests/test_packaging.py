"""environment.yml lists the same dependencies as pyproject.toml (no conda here to solve it)."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_normalise(r) for r in project["dependencies"]}
    wanted |= {_normalise(r) for r in project["optional-dependencies"]["test"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    (pip_section,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == wanted
    assert any(d.startswith("python") for d in env["dependencies"] if isinstance(d, str))
