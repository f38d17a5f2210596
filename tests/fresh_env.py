"""What the packaging and CI-file tests share: a copy of the source tree as git tracks it, and a
fresh virtual environment away from it where pcpcheck comes only from what the test installs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLMLIKE_RELEASE = ROOT / "tests" / "vllmlike" / "release"
GATHER_FILE = "vllm/v1/attention/ops/pcp.py"
ZOO_IMPORT = "from tests.zoo.correct import _gather_prefill_cache_inputs\n"
MANAGER_FILE = "vllm/v1/worker/gpu/pcp_manager.py"
MANAGER_IMPORT = "from tests.vllmlike.release.vllm.v1.worker.gpu.pcp_manager import PCPManager as _Release\n"


def copy_tracked(dest: Path) -> Path:
    """The tracked (and new, unignored) files of the checkout: setuptools' build/ of a checkout
    keeps files deleted since, which would land in a wheel."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def make_venv(path: Path) -> Path:
    """A virtual environment at `path` that sees this interpreter's third-party packages (torch,
    numpy, hypothesis, pytest, pip, setuptools) through one .pth line, and nothing else of the
    host: a path named in a .pth file has its own .pth files left unread, so the checkout's
    editable install (a .pth finder) stays out. pcpcheck itself is what the test installs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=300)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=300).stdout.strip()
    host = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(purelib, "_host_packages.pth").write_text("".join(f"{p}\n" for p in host))
    return path


def venv_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a command run in the venv: its bin/ first, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               **extra)
    return env


def vllm_checkout(dest: Path, manager: str | None = None) -> Path:
    """The project's vLLM-style release tree as a checkout (a fixture, never vLLM's code) that
    needs nothing of the source tree: the gather's import of the zoo's correct gather is replaced
    by that file's text. Its manager is optionally one of tests/vllmlike's buggy ones, a subclass
    of the release's manager appended to its file."""
    shutil.copytree(VLLMLIKE_RELEASE, dest)
    gather = dest / GATHER_FILE
    correct = (ROOT / "tests" / "zoo" / "correct.py").read_text()
    text = gather.read_text()
    assert ZOO_IMPORT in text, f"{gather}: the fixture no longer imports the zoo's gather"
    gather.write_text(text.replace(ZOO_IMPORT, correct))
    if manager:
        bug = (VLLMLIKE_RELEASE.parent / manager).read_text()
        assert MANAGER_IMPORT in bug, f"{manager}: not a subclass of the release's manager"
        path = dest / MANAGER_FILE
        path.write_text(path.read_text() + "\n" + bug.replace(MANAGER_IMPORT, "_Release = PCPManager\n"))
    return dest
