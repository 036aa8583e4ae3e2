"""Grade the assignment: run the graded tests once and score each part.

    python grade.py                   # a table: part, tests passed / total, points / max, total
    python grade.py --part NAME ...   # only these parts
    python grade.py --all             # every part, also those this copy does not assign
    python grade.py --json            # one JSON object on stdout (pytest's report goes to stderr)

The graded tests are ``tests/graded/test_<part>.py``, each test marked
``@pytest.mark.part("<part>")`` (assignment.py lists the parts and their points). A part
scores its points times the fraction of its tests that pass, rounded to 0.1: every test
passes, full points; none, 0. A test file that cannot even be imported scores 0 for its
part and nothing else. No test is timed.

One pytest run inside this process; a small plugin (``Recorder``) reads each test's part
marker and outcome. Exit status: 0 full points, 1 points missing, 2 the grader could not
grade (unknown part, a graded test without exactly one known part marker).
"""
import argparse
import contextlib
import json
import sys
from pathlib import Path

import pytest

import assignment

ROOT = Path(__file__).resolve().parent


class Recorder:
    """pytest plugin: which part each graded test belongs to, and which ones failed."""

    def __init__(self, parts):
        self.parts = parts                      # the names being graded
        self.part_of = {}                       # test id -> part
        self.failed = set()                     # test ids with a failed (or skipped) phase
        self.broken = set()                     # parts whose test file could not be imported
        self.problems = []                      # graded tests the grader cannot attribute

    def pytest_collectreport(self, report):
        if report.failed:
            for p in assignment.PARTS:
                if report.nodeid.replace("\\", "/").endswith(assignment.graded_tests_of(p)):
                    self.broken.add(p.name)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        known = {p.name for p in assignment.PARTS}
        keep, drop = [], []
        for item in items:
            names = [m.args[0] if m.args else None for m in item.iter_markers("part")]
            if len(names) != 1 or names[0] not in known:
                self.problems.append(f"{item.nodeid}: needs exactly one @pytest.mark.part(<name>) with a "
                                     f"name from assignment.PARTS, has {names}")
            elif names[0] in self.parts:
                self.part_of[item.nodeid] = names[0]
                keep.append(item)
                continue
            drop.append(item)
        items[:] = keep
        config.hook.pytest_deselected(items=drop)

    def pytest_runtest_logreport(self, report):
        if report.failed or report.skipped:
            self.failed.add(report.nodeid)


def score(recorder):
    """{part: {passed, total, points, max}} for the parts graded."""
    parts = {}
    for name in recorder.parts:
        tests = [t for t, p in recorder.part_of.items() if p == name]
        passed = sum(t not in recorder.failed for t in tests)
        top = assignment.part(name).points
        points = round(top * passed / len(tests), 1) if tests else 0
        parts[name] = {"passed": passed, "total": len(tests), "points": _number(points), "max": top}
    return parts


def _number(x):
    return int(x) if float(x).is_integer() else x


def run(parts, report_to):
    """Run the graded tests of ``parts``, pytest writing its report to ``report_to``."""
    recorder = Recorder(parts)
    args = [str(ROOT / assignment.GRADED_TESTS), "--rootdir", str(ROOT), "-q", "--tb=line",
            "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    with contextlib.redirect_stdout(report_to):
        code = pytest.main(args, plugins=[recorder])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        recorder.problems.append(f"pytest stopped: {code!r}")
    return recorder


def table(parts, broken, got, top):
    rows = [("part", "tests", "points")]
    for name, r in parts.items():
        note = "   could not import its tests (see above)" if name in broken else ""
        rows.append((name, f"{r['passed']}/{r['total']}", f"{r['points']}/{r['max']}{note}"))
    rows.append(("total", "", f"{got}/{top}"))
    width = max(len(r[0]) for r in rows) + 3
    return "\n".join(f"{a:<{width}}{b:<9}{c}" for a, b, c in rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", nargs="+", metavar="NAME", help="grade only these parts")
    parser.add_argument("--all", action="store_true", help="grade every part, also those not assigned here")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    try:
        names = [assignment.part(n).name for n in args.part] if args.part else None
    except ValueError as e:
        parser.exit(2, f"grade.py: error: {e}\n")
    if names is None:
        names = [p.name for p in assignment.PARTS if args.all or assignment.ASSIGNED is None
                 or p.name in assignment.ASSIGNED]
    recorder = run(names, sys.stderr if args.json else sys.stdout)
    if recorder.problems:
        parser.exit(2, "grade.py: cannot grade:\n  " + "\n  ".join(recorder.problems) + "\n")
    parts = score(recorder)
    got = _number(round(sum(r["points"] for r in parts.values()), 1))
    top = sum(r["max"] for r in parts.values())
    if args.json:
        print(json.dumps({"parts": parts, "points": got, "max": top}))
    else:
        print("\n" + table(parts, recorder.broken, got, top))
    return 0 if got == top else 1


if __name__ == "__main__":
    sys.exit(main())
