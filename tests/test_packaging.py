"""The wheel must ship every subpackage: pyproject lists them by hand (kernels/ maps to torchssvm.kernels)."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_subpackage():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "torchssvm").rglob("__init__.py")}
    on_disk |= {".".join(("torchssvm",) + p.parent.relative_to(ROOT).parts)
                for p in (ROOT / "kernels").rglob("__init__.py")}
    assert on_disk - listed == set(), f"pyproject.toml [tool.setuptools] packages misses {sorted(on_disk - listed)}"
    assert listed - on_disk == set(), f"pyproject.toml lists missing packages {sorted(listed - on_disk)}"
    assert config["package-dir"]["torchssvm.kernels"] == "kernels"
