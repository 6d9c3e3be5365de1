"""The client's package: a wheel builds, carries the adapter and the type marker, and has the
daemon's version."""

import re
import shutil
import subprocess
import sys
import zipfile

import minibatchd

from conftest import ROOT


def cargo_version():
    text = (ROOT / "Cargo.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def test_the_client_has_the_daemons_version():
    pyproject = (ROOT / "clients" / "python" / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == cargo_version()
    assert minibatchd.__version__ == cargo_version()


def test_a_wheel_builds_with_the_adapter_and_py_typed(tmp_path):
    # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "clients" / "python", src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    wheels = list(tmp_path.glob("minibatchd-*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    for f in ("minibatchd/__init__.py", "minibatchd/_client.py", "minibatchd/torch.py", "minibatchd/py.typed"):
        assert f in names, names
    assert wheels[0].name.startswith(f"minibatchd-{cargo_version()}-")
