"""The conda environment and pyproject.toml must list the same dependencies."""

import tomllib

import yaml
from packaging.requirements import Requirement

from tests.conftest import PROJECT_ROOT

# conda-forge names that differ from PyPI names
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PYTHON_PACKAGES = {"python", "pip"}


def _pyproject_requirements() -> dict[str, str]:
    meta = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + list(meta["optional-dependencies"]["test"])
    return {Requirement(r).name.lower(): str(Requirement(r).specifier) for r in reqs}


def _conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((PROJECT_ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        specs = dep["pip"] if isinstance(dep, dict) else [dep]
        for spec in specs:
            req = Requirement(spec)
            name = CONDA_TO_PYPI.get(req.name.lower(), req.name.lower())
            if name not in NOT_PYTHON_PACKAGES:
                out[name] = str(req.specifier)
    return out


def test_environment_yml_matches_pyproject():
    pyproject, conda = _pyproject_requirements(), _conda_requirements()
    assert sorted(conda) == sorted(pyproject), (
        f"only in environment.yml: {sorted(set(conda) - set(pyproject))}; "
        f"only in pyproject.toml: {sorted(set(pyproject) - set(conda))}"
    )
    differing = {n: (pyproject[n], conda[n]) for n in pyproject if pyproject[n] != conda[n]}
    assert not differing, f"version specifiers differ (pyproject, conda): {differing}"


def test_cpu_pins_are_within_the_user_facing_ranges():
    """requirements/cpu.txt may pin, but never outside what pyproject.toml allows."""
    pyproject = _pyproject_requirements()
    for line in (PROJECT_ROOT / "requirements" / "cpu.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.name.lower() in pyproject:
            pinned = [s.version for s in req.specifier if s.operator in ("==", ">=")]
            allowed = Requirement(f"x{pyproject[req.name.lower()]}").specifier
            for version in pinned:
                assert allowed.contains(version), f"{line} is outside pyproject's {req.name}{allowed}"
