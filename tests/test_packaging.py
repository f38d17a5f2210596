"""The wheel a user installs: its top-level import names are this project's own (no `spec`,
`reference` or `impl` in site-packages), it carries every package and SPEC.md, and installed
into a fresh virtual environment it runs `pcpcheck` without the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = {"pcpcheck", "pcpcheck_spec", "pcpcheck_reference", "pcpcheck_impl"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tracked files: setuptools' build/ of a checkout keeps files
    deleted since, which would land in the wheel."""
    out, tree = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("tree")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps",
                           "--no-build-isolation", "--quiet", "-w", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("pcpcheck-*.whl")
    return built


def test_the_wheel_installs_only_the_projects_own_names_and_every_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == TOP_LEVEL
    folders = {"pcpcheck": "pcpcheck", "spec": "pcpcheck_spec", "reference": "pcpcheck_reference",
               "impl": "pcpcheck_impl"}
    sources = {f"{name}/{path.relative_to(ROOT / folder).as_posix()}"
               for folder, name in folders.items() for path in (ROOT / folder).rglob("*.py")}
    assert sources <= set(names), sorted(sources - set(names))
    assert "pcpcheck_spec/SPEC.md" in names


def test_the_installed_wheel_runs_pcpcheck_from_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    # the machine's torch, numpy and hypothesis; pcpcheck itself only from the wheel
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-deps", "--no-index", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(python), "-c", "import pcpcheck, pcpcheck_spec, pcpcheck_impl; "
                            "print(pcpcheck.__file__, pcpcheck_spec.__file__, pcpcheck_impl.__file__)"],
                           capture_output=True, text=True, cwd=away, env=env, timeout=300)
    assert where.returncode == 0, where.stderr
    assert all(Path(path).is_relative_to(venv) for path in where.stdout.split()), where.stdout
    run = subprocess.run([str(venv / "bin" / "pcpcheck"), "--max-examples", "30"],
                         capture_output=True, text=True, cwd=away, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "every invariant holds" in run.stdout
