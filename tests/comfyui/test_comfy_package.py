"""Packaging: the repository root is a ComfyUI custom-node folder; registry metadata in pyproject."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_repository_root_loads_like_a_comfyui_custom_node(tmp_path):
    """ComfyUI imports <custom_nodes>/<folder>/__init__.py under a path-derived module name."""
    code = f"""
import importlib.util, sys
path = {str(ROOT)!r}
spec = importlib.util.spec_from_file_location(path.replace(".", "_x_"), path + "/__init__.py")
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
import diffspec
print(sorted(module.NODE_CLASS_MAPPINGS), diffspec.__file__.startswith(path), "comfy" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['DiffspecForecastStats',", "'DiffspecSamplerStats',", "'DiffspecSpecaForecast',",
                                  "'DiffspecSpeculativeSampler',", "'DiffspecTaylorForecast']", "True", "False"]


def test_pyproject_has_comfy_registry_metadata():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    comfy = data["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"] and comfy["Icon"].startswith("https://")
    assert data["project"]["urls"]["Repository"].startswith("https://")
    assert "comfyui" not in data["project"]["name"].lower()
