"""`--junit FILE`: one JUnit test case per regime x invariant, as CI dashboards read them.

failed: a new violation (the counterexample report is the failure text); skipped: not
applicable in that regime (REPLICA under dcp, SHARD elsewhere: the reason the verdict table's
footnote gives) or a baselined violation."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from pcpcheck.render.report import checked_ids, not_applicable_reason


def skip_reason(result, summary, invariant: str, state: str) -> str:
    """Why a regime x invariant is not run ("n/a": the verdict tables' footnote) or not failed
    ("known"): the words JUnit and the pytest plugin give."""
    if state == "known":
        return f"known violation, listed in {result.baseline.path}"
    return not_applicable_reason(result, summary, invariant)


def junit_xml(result) -> str:
    suite = ET.Element("testsuite", name="pcpcheck", hostname="", timestamp="")
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for summary in result.regimes:
        for invariant in checked_ids(result):
            state, counterexample = result.outcome(summary.regime, invariant)
            case = ET.SubElement(suite, "testcase", classname=f"pcpcheck.{summary.regime}",
                                 name=invariant, time=f"{summary.seconds:.3f}")
            counts["tests"] += 1
            if state == "failed":
                counts["failures"] += 1
                text = (counterexample.report if counterexample is not None
                        else f"{invariant} violated in regime {summary.regime}")
                failure = ET.SubElement(case, "failure", type=invariant, message=text.splitlines()[0])
                failure.text = text
            elif state in ("n/a", "known"):
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=skip_reason(result, summary, invariant, state))
    properties = ET.Element("properties")
    for name, value in (("pcpcheck.version", result.version), ("target", result.target)):
        ET.SubElement(properties, "property", name=name, value=value)
    suite.insert(0, properties)
    suite.set("tests", str(counts["tests"]))
    suite.set("failures", str(counts["failures"]))
    suite.set("skipped", str(counts["skipped"]))
    suite.set("errors", "0")
    suite.set("time", f"{sum(s.seconds for s in result.regimes):.3f}")
    tree: ET.ElementTree[ET.Element] = ET.ElementTree(suite)
    return ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=True)
