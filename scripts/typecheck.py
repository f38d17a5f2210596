"""mypy over the four packages under their import names (pyproject.toml's [tool.mypy]: strict on
pcpcheck.shared and the spec, the default level elsewhere); exits with mypy's code.

    python scripts/typecheck.py

The statements live in spec/, reference/ and impl/ but install as pcpcheck_spec,
pcpcheck_reference and pcpcheck_impl (pyproject.toml's package-dir); an editable install maps
them with an import hook, which mypy does not follow. mypy reads them here through a folder of
links named as they import (kept in mypy's cache folder, so its cache sees one path per module),
and each file is reported by its path in this tree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder, for the packages whose folder is named otherwise (pcpcheck is found here)
LINKED = {"pcpcheck_spec": "spec", "pcpcheck_reference": "reference", "pcpcheck_impl": "impl"}


def main() -> int:
    links = ROOT / ".mypy_cache" / "packages"
    links.mkdir(parents=True, exist_ok=True)
    for name, folder in LINKED.items():
        if not (links / name).is_symlink():
            os.symlink(ROOT / folder, links / name)
    arguments = ["--config-file", "pyproject.toml", "-p", "pcpcheck"]
    for name in LINKED:
        arguments += ["-p", name]
    os.environ["MYPYPATH"] = str(links)
    os.chdir(ROOT)
    out, err, code = api.run(arguments)
    for name, folder in LINKED.items():  # the tree's paths, not the links'
        out = out.replace(f"{links}/{name}/", f"{folder}/").replace(
            f".mypy_cache/packages/{name}/", f"{folder}/")
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
