"""What a user installs: `python -m build` makes an sdist and, from it, the wheel. The sdist
carries the sources, SPEC.md, the docs, the license and the changelog, and nothing of the tests;
the wheel installs only the project's own import names. Installed into a fresh virtual
environment, away from the source tree, the wheel runs `pcpcheck`, a check of a vLLM file and of a
checkout, the pytest plugin, and the README's commands."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from fresh_env import GATHER_FILE, ROOT, copy_tracked, make_venv, venv_env, vllm_checkout

TOP_LEVEL = {"pcpcheck", "pcpcheck_spec", "pcpcheck_reference", "pcpcheck_impl"}
FOLDERS = {"pcpcheck": "pcpcheck", "spec": "pcpcheck_spec", "reference": "pcpcheck_reference",
           "impl": "pcpcheck_impl"}
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
pytestmark = pytest.mark.xdist_group("packaging")  # one build and one venv for the module


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel), as `python -m build` makes them (the wheel from the unpacked sdist)."""
    out = tmp_path_factory.mktemp("dist")
    tree = copy_tracked(tmp_path_factory.mktemp("tree"))
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                           str(tree)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (sdist,), (wheel,) = out.glob("pcpcheck-*.tar.gz"), out.glob("pcpcheck-*.whl")
    return sdist, wheel


def test_the_sdist_carries_sources_spec_docs_license_and_no_tests(built):
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    needed = {name for name in tracked if name.split("/")[0] in (*FOLDERS, "docs")}
    needed |= {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "spec/SPEC.md"}
    assert needed <= names, sorted(needed - names)
    assert not [name for name in names if name.split("/")[0] in ("tests", "benchmarks", "scripts")]


def test_the_wheel_installs_only_the_projects_own_names_with_spec_docs_and_license(built):
    _, wheel = built
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == TOP_LEVEL
    sources = {f"{name}/{path.relative_to(ROOT / folder).as_posix()}"
               for folder, name in FOLDERS.items() for path in (ROOT / folder).rglob("*.py")}
    docs = {f"pcpcheck/docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert sources | docs | {"pcpcheck_spec/SPEC.md"} <= set(names), sorted(sources | docs - set(names))
    # PEP 561: each package says it carries its annotations
    assert {f"{name}/py.typed" for name in FOLDERS.values()} <= set(names)
    assert f"pcpcheck-{VERSION}.dist-info/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"pcpcheck-{VERSION}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    # nothing heavy by default: triton and CrossHair only in their extras
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    default = {re.split(r"[<>=; ]", line.split(":", 1)[1].strip())[0] for line in required
               if "extra ==" not in line}
    assert default == {"hypothesis", "numpy", "torch", "greenlet", "coverage"}
    assert 'triton>=3.0; extra == "kernels"' in metadata


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (its dependencies come from the host's packages)."""
    venv = make_venv(tmp_path_factory.mktemp("wheel-venv") / "venv")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "--no-deps", "--no-index", "--quiet", str(built[1])],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return venv


def run(venv: Path, command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, cwd=cwd,
                          env=venv_env(venv), timeout=600, executable="/bin/bash")


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A vLLM-style checkout away from the source tree, where the wheel's commands run."""
    return vllm_checkout(tmp_path / "vllm-checkout")


def test_the_installed_wheel_imports_from_the_venv_without_the_source_tree(installed, checkout):
    done = run(installed, "python -c 'import sys, pcpcheck, pcpcheck_spec, pcpcheck_impl, "
                          "pcpcheck_reference; print(*sys.modules[\"pcpcheck\"].__path__, "
                          "pcpcheck_spec.__file__, pcpcheck_impl.__file__, "
                          "pcpcheck_reference.__file__); print(*sys.path)'", checkout)
    assert done.returncode == 0, done.stderr
    modules, path = done.stdout.splitlines()
    assert all(Path(p).is_relative_to(installed) for p in modules.split()), modules
    # the host's packages (make_venv) may lie in the source tree: a newcomer's `.venv` there
    host = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    assert not [p for p in path.split()
                if Path(p).resolve().is_relative_to(ROOT) and Path(p).resolve() not in host], path


def test_version_is_pyprojects_in_the_command_and_the_json(installed, checkout):
    done = run(installed, "pcpcheck --version", checkout)
    assert (done.returncode, done.stdout.strip()) == (0, f"pcpcheck {VERSION}")
    done = run(installed, "pcpcheck --max-examples 30 --regime replicated --json v.json", checkout)
    assert done.returncode == 0 and "every invariant holds" in done.stdout, done.stdout + done.stderr
    assert json.loads((checkout / "v.json").read_text())["version"] == VERSION


def test_the_wheel_checks_a_vllm_file_and_a_checkout(installed, checkout):
    done = run(installed, f"pcpcheck check {GATHER_FILE} --max-examples 30", checkout)
    assert done.returncode == 0 and "every invariant holds" in done.stdout, done.stdout + done.stderr
    done = run(installed, "pcpcheck vllm . --max-examples 30 --summary s.md", checkout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "every invariant holds" in (checkout / "s.md").read_text()


def test_the_wheels_pytest_plugin_runs_an_item_per_regime_and_invariant(installed, checkout):
    done = run(installed, f"python -m pytest -p no:cacheprovider -q --pcp-target={GATHER_FILE} "
                          "--pcp-max-examples 20 --pcp-regime replicated", checkout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^\d+ passed", done.stdout.splitlines()[-1]), done.stdout[-500:]


def readme_block(heading: str) -> list[str]:
    """The commands of the first bash block after `heading` in the README, comments dropped."""
    text = (ROOT / "README.md").read_text().split(f"\n{heading}\n", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_readmes_commands_run_from_the_wheel_install(installed, built, checkout):
    install, commands = readme_block("## Install"), readme_block("### From the wheel install")
    assert install[0] == "python -m build" and install[1].startswith("pip install dist/pcpcheck-")
    assert Path(shlex.split(install[1])[2]).name == built[1].name  # the wheel the test installed
    assert len(commands) >= 4
    for command in commands:
        done = run(installed, command, checkout)
        assert done.returncode == 0, (command, done.stdout[-2000:] + done.stderr[-2000:])
