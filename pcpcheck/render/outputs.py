"""The files a command writes besides its report: `--json`, `--junit`, `--summary`, `--html`,
`--repro-dir`.
Each path is checked before the run (a usage error at once), each written after it, and the
command says where; a write that fails is printed and never hides the verdict."""

from __future__ import annotations

import dataclasses
import os
import sys

from pcpcheck.shared.errors import UsageError

_FILES = ("json", "junit", "summary")
STDOUT = "-"  # --json -: the JSON to the stream the command set aside (args.json_stream)
_DIRS = ("html", "repro_dir")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_outputs(args) -> None:
    """Every output path usable, before the run: UsageError (exit 2) names the first that is not."""
    from pcpcheck.render.html import html_page
    for name in _FILES + _DIRS:
        path = getattr(args, name, None)
        if not path or (name == "json" and path == STDOUT):
            continue
        option = _option(name)
        is_dir = name in _DIRS and not (name == "html" and html_page(path))
        if os.path.exists(path):
            if os.path.isdir(path) != is_dir:
                raise UsageError(f"{option} {path}: " + ("not a directory" if is_dir else "is a directory"))
            if not os.access(path, os.W_OK):
                raise UsageError(f"{option} {path}: not writable")
            continue
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            if not is_dir:
                raise UsageError(f"{option} {path}: directory {parent} does not exist")
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise UsageError(f"{option} {path}: cannot create it in {parent}")


def write_outputs(args, result) -> None:
    """Write each output asked for (a CheckResult: all five; a DiffResult: --json) and say where;
    say why any failed, and that the verdict stands."""
    failed = 0

    def attempt(name, write, what):
        nonlocal failed
        path = getattr(args, name)
        try:
            written = write(path)
        except OSError as exc:
            failed += 1
            print(f"pcpcheck: cannot write {exc.filename or path}: {exc.strerror or exc}",
                  file=sys.stderr)
            return None
        print(f"{_option(name)}: wrote {what(written)}")
        return written

    if getattr(args, "repro_dir", None) and result.counterexamples:
        from pcpcheck.render.repro import write_reproducers
        written = attempt("repro_dir", lambda path: write_reproducers(path, result),
                          lambda paths: f"{len(paths)} reproducer(s) into {args.repro_dir}")
        result = dataclasses.replace(result, reproducers=tuple(written or ()))
    in_full: dict[str, str] = {}  # the outputs that hold every counterexample, for the summary
    if getattr(args, "html", None):
        from pcpcheck.render.html import write_html
        pages = attempt("html", lambda path: write_html(path, result),
                        lambda paths: f"{len(paths)} page(s), start at {paths[0]}")
        if pages:
            in_full["html"] = pages[0]
    if getattr(args, "json", None) == STDOUT:
        args.json_stream.write(result.to_json() + "\n")
        args.json_stream.flush()
    elif getattr(args, "json", None):
        if attempt("json", lambda path: _write_text(path, result.to_json()), lambda path: path):
            in_full["json"] = args.json
    if getattr(args, "junit", None):
        from pcpcheck.render.junit import junit_xml
        attempt("junit", lambda path: _write_text(path, junit_xml(result)), lambda path: path)
    if getattr(args, "summary", None):
        from pcpcheck.render.summary import summary_markdown
        attempt("summary", lambda path: _write_text(path, summary_markdown(result, in_full)),
                lambda path: path)
    if failed:
        print(f"pcpcheck: the verdict above stands (exit {result.exit_code}); {failed} "
              "output(s) not written", file=sys.stderr)


def _write_text(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
