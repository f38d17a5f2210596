"""Where a vLLM release's PCP files come from, read without installing vLLM.

SOURCE (the `pcpcheck vllm SOURCE` argument) is one of:

- a release, `0.33.0` or `vllm==0.33.0`: its wheel, found in the cache directory or fetched there
  with `pip download vllm==X --no-deps --only-binary=:all:`, and read as a zip;
- a wheel file (`vllm-*.whl`);
- a checkout: a directory holding `vllm/v1/worker/gpu/pcp_manager.py` (or the `vllm` package
  directory itself);
- `installed`: the `vllm` package on sys.path, located without importing it.

`resolve(source) -> Source`; `Source.read(relpath)` gives a file's text and records its sha256.
`Source.spec()` is plain data (JSON-able) from which `from_spec` rebuilds it in another process.
Every failure is a `SourceError` with one line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from pcpcheck.shared.errors import SourceError

MANAGER = "vllm/v1/worker/gpu/pcp_manager.py"
GATHERS = ("vllm/v1/attention/ops/pcp.py", "vllm/model_executor/layers/attention/pcp.py")
CACHE_ENV = "PCPCHECK_WHEEL_CACHE"
_RELEASE = re.compile(r"^(?:vllm==)?(\d+\.\d+\.\d+(?:[.\-+]?\w+)*)$")
FIRST_PCP_RELEASE = (0, 26, 0)  # the first release with a PCPManager (docs/semantics.md section 9)
_VERSION_LINE = re.compile(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""")


def cache_dir() -> Path:
    """Where fetched wheels live: $PCPCHECK_WHEEL_CACHE, else ~/.cache/pcpcheck/wheels."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "pcpcheck" / "wheels"


@dataclass(kw_only=True)
class Source:
    kind: str  # "wheel" | "checkout" | "installed"
    location: str  # the wheel file or the directory holding `vllm/`
    release: str  # version, as the source states it ("unknown" if it does not)
    hashes: dict[str, str] = field(default_factory=dict)  # relpath -> sha256 of what was read

    def spec(self) -> dict[str, str]:
        return {"kind": self.kind, "location": self.location, "release": self.release}

    def has(self, relpath: str) -> bool:
        if self.kind == "wheel":
            return relpath in self._wheel_names()
        return (Path(self.location) / relpath).is_file()

    def _wheel(self) -> zipfile.ZipFile:
        """The wheel, opened once: its directory has thousands of entries, and a release's
        load reads a hundred of its files."""
        wheel = self.__dict__.get("_zip")
        if wheel is None:
            wheel = self.__dict__["_zip"] = zipfile.ZipFile(self.location)
        return wheel

    def _wheel_names(self) -> frozenset[str]:
        names = self.__dict__.get("_names")
        if names is None:
            names = self.__dict__["_names"] = frozenset(self._wheel().NameToInfo)
        return names

    def files_under(self, prefix: str) -> list[str]:
        """The relpaths of this tree's files under the folder `prefix` (ending in '/'), sorted."""
        if self.kind == "wheel":
            return sorted(name for name in self._wheel_names() if name.startswith(prefix))
        root = Path(self.location)
        return sorted(path.relative_to(root).as_posix()
                      for path in (root / prefix).rglob("*") if path.is_file())

    def module_file(self, module: str) -> tuple[str, bool] | None:
        """(relpath, is_package) of a dotted module's source file in this tree, else None (a C
        extension, or not part of it)."""
        base = module.replace(".", "/")
        for relpath, package in ((f"{base}/__init__.py", True), (f"{base}.py", False)):
            if self.has(relpath):
                return relpath, package
        return None

    def read(self, relpath: str) -> str:
        try:
            if self.kind == "wheel":
                data = self._wheel().read(relpath)
            else:
                data = (Path(self.location) / relpath).read_bytes()
        except (KeyError, OSError, zipfile.BadZipFile) as exc:
            raise SourceError(f"{self.describe()}: cannot read {relpath}: {exc}") from None
        self.hashes[relpath] = hashlib.sha256(data).hexdigest()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SourceError(f"{self.describe()}: {relpath} is not UTF-8 text") from None

    def filename(self, relpath: str) -> str:
        """A name for tracebacks and reports: the path inside the wheel, or the real file."""
        if self.kind == "wheel":
            return f"{self.location}!/{relpath}"
        return str(Path(self.location) / relpath)

    def describe(self) -> str:
        return f"vLLM {self.release} ({self.kind} {self.location})"


def from_spec(spec: dict[str, str]) -> Source:
    return Source(kind=spec["kind"], location=spec["location"], release=spec["release"])


def _wheel_release(path: Path) -> str:
    parts = path.name.split("-")
    return parts[1] if len(parts) > 2 and parts[0] == "vllm" else "unknown"


def _open_wheel(path: Path) -> Source:
    if not zipfile.is_zipfile(path):
        raise SourceError(f"{path}: not a wheel (not a zip file)")
    return Source(kind="wheel", location=str(path), release=_wheel_release(path))


def fetch_release(version: str, directory: Path | None = None) -> Path:
    """The wheel of vllm==version in `directory` (default: cache_dir()), fetched with pip if
    absent (pip's own cache makes a repeat fast). pip writes into a private folder and the
    wheel is renamed into place whole: a concurrent run never opens a half-written wheel."""
    directory = directory or cache_dir()
    found = sorted(p for p in directory.glob(f"vllm-{version}-*.whl") if p.is_file()) \
        if directory.is_dir() else []  # a dangling link (its target deleted) is no wheel
    if found:
        return found[0]
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as private:
        command = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
                   "--only-binary=:all:", "--quiet", "-d", private]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SourceError(f"vllm=={version}: pip download failed: {exc}") from None
        fetched = sorted(Path(private).glob(f"vllm-{version}-*.whl"))
        if done.returncode != 0 or not fetched:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            why = lines[-1].strip() if lines else f"exit {done.returncode}"
            raise SourceError(f"vllm=={version}: cannot fetch the wheel (pip download: {why})")
        os.replace(fetched[0], directory / fetched[0].name)
    return directory / fetched[0].name


def _checkout_release(root: Path) -> str:
    for name in ("vllm/_version.py", "vllm/version.py"):
        text = (root / name).read_text(errors="replace") if (root / name).is_file() else ""
        match = _VERSION_LINE.search(text)
        if match:
            return match.group(1)
    return "unknown"


def _checkout(root: Path, kind: str) -> Source:
    if root.name == "vllm" and (root / MANAGER.partition("/")[2]).is_file():
        root = root.parent
    if not (root / MANAGER).is_file():
        raise SourceError(f"{root}: no {MANAGER} (not a vLLM checkout with the PCP manager)")
    return Source(kind=kind, location=str(root), release=_checkout_release(root))


def _numbers(version: str) -> tuple[int, int, int]:
    """(X, Y, Z) of X.Y.Z[suffix] (0.26.0rc1 -> (0, 26, 0))."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    assert match is not None  # a version _RELEASE matched
    return int(match[1]), int(match[2]), int(match[3])


def resolve(source: str) -> Source:
    """SOURCE -> Source (see the module docstring)."""
    text = str(source).strip()
    if not text:
        raise SourceError("empty SOURCE")
    if text == "installed":
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise SourceError("installed: no vllm package on sys.path")
        return _checkout(Path(list(spec.submodule_search_locations)[0]), "installed")
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix != ".whl":
            raise SourceError(f"{path}: not a wheel (.whl) or a checkout directory")
        return _open_wheel(path)
    if path.is_dir():
        return _checkout(path, "checkout")
    match = _RELEASE.match(text)
    if match:
        version = match.group(1)
        if _numbers(version) < FIRST_PCP_RELEASE:
            first = ".".join(map(str, FIRST_PCP_RELEASE))
            raise SourceError(f"vLLM {version} has no PCP path to check: {MANAGER} first ships "
                              f"in {first}")  # known before fetching ~340 MB
        return _open_wheel(fetch_release(version))
    if text.endswith(".whl") or os.sep in text or (os.altsep and os.altsep in text):
        raise SourceError(f"{text}: no such file or directory")  # a path, not a version
    raise SourceError(f"{text!r}: not a release (0.33.0, vllm==0.33.0), a wheel, a checkout "
                      "or 'installed'")


def names_a_tree(source: str | os.PathLike[str]) -> bool:
    """Whether SOURCE names a vLLM tree (what `resolve` takes: a release, a wheel, a checkout,
    `installed`) rather than a gather target (a .py file, module:function, impl); read from the
    text and the file system alone, nothing fetched."""
    text = os.fspath(source).strip()
    path = Path(text).expanduser()
    if text == "impl":  # the bundled gather, even where a folder of that name is at hand
        return False
    return (text == "installed" or path.is_dir() or text.endswith(".whl")
            or (not path.exists() and _RELEASE.match(text) is not None))
