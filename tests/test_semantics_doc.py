"""docs/semantics.md is the facts document the spec rests on, and it ships with the project: no
file cites a document outside the repository, every section citation ("sem §N" in SPEC.md,
"docs/semantics.md section N" anywhere) names a section that exists, the bug classes keep their
numbers 1-16, the branch table keeps rows A-E, and the wheel installs the page."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEMANTICS = ROOT / "docs" / "semantics.md"
SPEC_MD = ROOT / "spec" / "SPEC.md"
# the old, external facts document: nothing shipped may point at it
OLD_NAMES = ("shared/docs", "pcp-semantics")
NO_OLD_NAMES_IN = ("spec", "docs", "reference", "impl", "pcpcheck", "README.md")
CITATIONS_IN = ("spec", "reference", "impl", "pcpcheck", "docs", "tests", "README.md")
# "docs/semantics.md section 5", "`docs/semantics.md` sections 2 and 3", "... sections 2-5", ...
CITATION = re.compile(r"`?docs/semantics\.md`?,?\s+sections?\s+(\d+(?:\s*(?:-|,|and)\s*\d+)*)")
SEM = re.compile(r"§§?\s*(\d+(?:\s*-\s*\d+)?)")  # SPEC.md: "sem §3", "§9", "sem §§2-5"
BUG_CLASS = re.compile(r"\b[Bb]ug class(?:es)?:?\s+(\d+(?:\s*(?:,|/|and)\s*\d+)*)")


def _files(names, suffixes=None):
    for name in names:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in found:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            if suffixes is None or file.suffix in suffixes:
                yield file


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _numbers(cited: str) -> list[int]:
    """Every section a citation names: "2-5" is 2, 3, 4 and 5; "2, 9" and "2 and 3" each."""
    numbers = []
    for part in re.split(r"\s*(?:,|and)\s*", cited):
        low, _, high = part.partition("-")
        numbers += range(int(low), int(high or low) + 1)
    return numbers


def _sections() -> dict[int, str]:
    """Section number -> its text, from the `## N. Title` headings of docs/semantics.md."""
    parts = re.split(r"^## (\d+)\. ", SEMANTICS.read_text(), flags=re.M)
    return {int(number): body for number, body in zip(parts[1::2], parts[2::2])}


def test_the_sections_are_numbered_1_to_11_in_order():
    assert re.findall(r"^## (\d+)\. ", SEMANTICS.read_text(), re.M) == [str(n) for n in range(1, 12)]


def test_nothing_cites_the_external_facts_document():
    found = []
    for file in _files(NO_OLD_NAMES_IN):
        text = file.read_bytes().decode("utf-8", errors="replace")
        for name in OLD_NAMES:
            for match in re.finditer(re.escape(name), text):
                found.append(f"{file.relative_to(ROOT)}:{_line(text, match.start())}: {name}")
    assert not found, "\n".join(found)


def test_spec_md_defines_sem_as_the_shipped_document():
    text = SPEC_MD.read_text()
    assert "](../docs/semantics.md)" in text
    assert (SPEC_MD.parent / "../docs/semantics.md").resolve() == SEMANTICS.resolve()


def test_every_sem_citation_of_spec_md_names_a_section():
    sections = _sections()
    text = SPEC_MD.read_text()
    cited = [(match.group(0), _line(text, match.start()), number)
             for match in SEM.finditer(text) for number in _numbers(match.group(1))]
    assert cited, "SPEC.md cites no section of sem"
    missing = [f"spec/SPEC.md:{line}: {what}" for what, line, number in cited if number not in sections]
    assert not missing, "\n".join(missing)


def test_every_docs_semantics_citation_names_a_section():
    sections = _sections()
    cited, missing = 0, []
    for file in _files(CITATIONS_IN, (".py", ".md")):
        text = file.read_text(errors="replace")
        for match in CITATION.finditer(text):
            for number in _numbers(match.group(1)):
                cited += 1
                if number not in sections:
                    missing.append(f"{file.relative_to(ROOT)}:{_line(text, match.start())}: "
                                   f"{' '.join(match.group(0).split())}")
    assert cited, "no file cites a section of docs/semantics.md"
    assert not missing, "\n".join(missing)


def test_the_bug_classes_are_numbered_1_to_16_and_every_cited_class_exists():
    items = [int(n) for n in re.findall(r"^(\d+)\. ", _sections()[7], re.M)]
    assert items == list(range(1, 17))
    unknown = []
    for file in _files(CITATIONS_IN, (".py", ".md")):
        text = file.read_text(errors="replace")
        for match in BUG_CLASS.finditer(text):
            if any(not 1 <= n <= 16 for n in _numbers(match.group(1).replace("/", ","))):
                unknown.append(f"{file.relative_to(ROOT)}:{_line(text, match.start())}: {match.group(0)}")
    assert not unknown, "\n".join(unknown)


def test_the_branch_table_has_rows_a_to_e():
    rows = re.findall(r"^\|\s*([A-Z])\b", _sections()[5], re.M)
    assert rows == ["A", "B", "C", "D", "E"]


def test_the_wheel_installs_the_page_beside_the_other_docs():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"]["pcpcheck.docs"] == "docs"
    assert "pcpcheck.docs" in tool["packages"]
    assert any(fnmatch.fnmatch(SEMANTICS.name, pattern) for pattern in tool["package-data"]["pcpcheck.docs"])
