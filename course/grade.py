"""Grade the assignment: each part's tests run in a process of their own, under a time limit.

    python -m course.grade  # this copy: part, tests passed (visible, hidden), points, total
    python -m course.grade --part NAME ...     # only these parts
    python -m course.grade --all               # every part, also those this copy does not assign
    python -m course.grade --json  # one JSON object on stdout (the tests' own output goes to stderr)
    python -m course.grade --submission DIR    # a student's files, graded in a fresh copy of this tree

A part's tests are its visible tests, ``tests/graded/test_<part>.py`` (the student has
them), and, in the instructor's copy only, its hidden tests ``tests/hidden/test_<part>.py``
(randomized inputs against independent computations). Every test is marked
``@pytest.mark.part("<part>")``; ``@pytest.mark.weight(w)`` makes one count w times (default 1).
A part scores its points times the weighted fraction of its visible tests that pass; with
hidden tests present, ``assignment.HIDDEN_SHARE`` of its points come from those instead.
Rounded to 0.1.

Each part is graded by a child process, ``python -m course.grade --record FILE --part NAME``, that
runs pytest on the part's test files and writes each outcome to FILE as it happens; this
process reads FILE and computes the points. Nothing the tested code prints counts, a part
whose tests do not finish within ``--time-limit`` seconds scores what passed until then,
and a file that cannot be imported costs the parts that live in it.

``--submission DIR`` takes from DIR only the files the parts live in (losses.py, rewards.py,
train.py) and lists anything else there as ignored. It copies this tree's Python files, its
pytest.ini and its graded and hidden tests into a temporary directory, puts the submitted
files in place of the part files (a part file not submitted is left out: its parts score 0)
and grades there. Exit status: 0 full points, 1 points missing, 2 the grader could not grade.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course import assignment

ROOT = Path(__file__).resolve().parents[1]                # the repo root
SETS = {"visible": assignment.GRADED_TESTS, "hidden": assignment.HIDDEN_GRADED_TESTS}


# ----------------------------------------------------------------------------------------
# The child: one part's tests, in this process, each outcome written down as it happens

def where(nodeid):
    """(set, part) of a test id or test file: ("hidden", "tepo") for tests/hidden/test_tepo.py::..."""
    path = nodeid.replace("\\", "/").split("::")[0]
    folder, _, name = path.rpartition("/")
    return (("hidden" if folder == SETS["hidden"] else "visible"),
            name.removeprefix("test_").removesuffix(".py"))


class Recorder:
    """pytest plugin: writes to ``path`` one JSON line per event (the tests collected, a test
    file that cannot be imported, each test's outcome, the end)."""

    def __init__(self, parts, path):
        self.parts, self.file = parts, open(path, "w", encoding="utf-8")
        self.failed = set()

    def write(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def pytest_collectreport(self, report):
        if report.failed:
            test_set, part = where(report.nodeid)
            self.write(broken=test_set, part=part)

    def pytest_collection_modifyitems(self, items):
        tests, problems = [], []
        for item in items:
            names = [m.args[0] if m.args else None for m in item.iter_markers("part")]
            weight = item.get_closest_marker("weight")
            weight = weight.args[0] if weight else 1
            if len(names) != 1 or names[0] not in self.parts or names[0] != where(item.nodeid)[1]:
                problems.append(f"{item.nodeid}: needs exactly one @pytest.mark.part(<the part its file is "
                                f"named after>), has {names}")
            elif not (isinstance(weight, (int, float)) and weight > 0):
                problems.append(f"{item.nodeid}: @pytest.mark.weight needs a positive number, has {weight!r}")
            tests.append(dict(id=item.nodeid, part=names[0] if names else None, set=where(item.nodeid)[0],
                              weight=weight))
        self.write(collected=tests, problems=problems)

    def pytest_runtest_logreport(self, report):
        if report.failed or report.skipped:
            self.failed.add(report.nodeid)
        if report.when == "teardown":
            self.write(id=report.nodeid, passed=report.nodeid not in self.failed)

    def pytest_sessionfinish(self):
        self.write(finished=True)
        self.file.close()


def run_tests(parts, record):
    """The child's work: pytest on the parts' test files in this process, outcomes to ``record``."""
    import pytest
    files = [str(ROOT / folder / f"test_{name}.py") for name in parts for folder in SETS.values()
             if (ROOT / folder / f"test_{name}.py").exists()]
    pytest.main(files + ["--rootdir", str(ROOT), "-q", "--tb=line", "-p", "no:cacheprovider"],
                plugins=[Recorder(parts, record)])
    return 0


def read_record(path):
    """The child's record as a list of dicts (the last line of a killed child may be cut off)."""
    lines = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return lines


# ----------------------------------------------------------------------------------------
# The grader: one child per part, the points from what the children recorded

def grade_part(tree, name, time_limit):
    """Run one part's child in ``tree``; its record (a list of dicts), output and whether it timed out."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        record = Path(tmp) / "record.jsonl"
        record.touch()
        command = [sys.executable, "-m", "course.grade", "--record", str(record), "--part", name]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            run = subprocess.run(command, cwd=tree, capture_output=True, text=True,
                                 timeout=time_limit, env=env)
            output, timed_out = run.stdout + run.stderr, False
        except subprocess.TimeoutExpired as e:
            output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                             for x in (e.stdout, e.stderr))
            timed_out = True
        lines = read_record(record)
        return lines, output, timed_out


def score(name, lines, timed_out, hidden_present, time_limit):
    """{points, max, visible, hidden, note} of one part from its child's record."""
    top = assignment.part(name).points
    collected = next((r for r in lines if "collected" in r), None)
    passed = {r["id"] for r in lines if r.get("passed")}
    broken = {r["broken"] for r in lines if r.get("part") == name and "broken" in r}
    sets = ["visible"] + ["hidden"] * hidden_present
    counts, fractions, problems = {}, {}, (collected or {}).get("problems", [])
    for s in sets:
        tests = [t for t in (collected or {}).get("collected", []) if t["set"] == s and t["part"] == name]
        won = [t for t in tests if t["id"] in passed]
        counts[s] = {"passed": len(won), "total": len(tests)}
        total = sum(t["weight"] for t in tests)
        fractions[s] = 0.0 if s in broken or not total else sum(t["weight"] for t in won) / total
    if hidden_present:
        points = top * ((1 - assignment.HIDDEN_SHARE) * fractions["visible"]
                        + assignment.HIDDEN_SHARE * fractions["hidden"])
    else:
        points = top * fractions["visible"]
    notes = [f"could not import its {s} tests (see the output)" for s in sets if s in broken]
    if timed_out:
        notes.append(f"stopped at the time limit ({time_limit:g} s): unfinished tests count as failed")
    elif collected is None:
        notes.append("its tests' process ended before collecting them (see the output)")
    elif not any("finished" in r for r in lines):
        notes.append("its tests' process ended early: unfinished tests count as failed")
    return dict(points=_number(round(points, 1)), max=top, visible=counts["visible"],
                hidden=counts.get("hidden"), note="; ".join(notes)), problems


def _number(x):
    return int(x) if float(x).is_integer() else x


def part_files():
    return sorted({p.file for p in assignment.PARTS})


def grading_tree(source, dest):
    """A pristine copy of what grading needs from ``source``: its Python files (the root's, and the
    folders train.py and the grader import), pytest.ini, and its graded and hidden tests (no runs,
    no logs, no other tests)."""
    for path in sorted(source.glob("*.py")) + [source / "pytest.ini"]:
        shutil.copy2(path, dest / path.name)
    for folder in ("engine", "course"):
        (dest / folder).mkdir()
        for path in sorted((source / folder).glob("*.py")):
            shutil.copy2(path, dest / folder / path.name)
    for folder in SETS.values():
        if (source / folder).is_dir():
            shutil.copytree(source / folder, dest / folder,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def take_submission(directory, tree):
    """Put the submitted part files into ``tree``: (used, ignored, not submitted) file names."""
    wanted = set(part_files())
    found = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    used = [n for n in found if n in wanted]
    for name in wanted:
        (tree / name).unlink(missing_ok=True)           # a part file not submitted is not graded
    for name in used:
        shutil.copyfile(directory / name, tree / name)
    return used, [n for n in found if n not in wanted], sorted(wanted - set(used))


def grade(tree, names, time_limit, jobs, not_submitted=(), log=sys.stdout):
    """Every part of ``names`` graded in ``tree``: ({part: result}, problems)."""
    hidden_present = lambda n: (tree / SETS["hidden"] / f"test_{n}.py").exists()
    missing = {n for n in names if assignment.part(n).file in not_submitted}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = dict(zip(names, pool.map(
            lambda n: None if n in missing else grade_part(tree, n, time_limit), names)))
    results, problems = {}, []
    for name, run in runs.items():
        if run is None:
            results[name] = dict(points=0, max=assignment.part(name).points, visible=None, hidden=None,
                                 note=f"{assignment.part(name).file} was not submitted")
            continue
        lines, output, timed_out = run
        print(f"--- {name} " + "-" * max(0, 76 - len(name)) + "\n" + output.rstrip(), file=log)
        results[name], trouble = score(name, lines, timed_out, hidden_present(name), time_limit)
        problems += trouble
    return results, problems


def table(results, got, top):
    count = lambda c: f"{c['passed']}/{c['total']}" if c else "-"
    rows = [("part", "visible", "hidden", "points")]
    for name, r in results.items():
        rows.append((name, count(r["visible"]), count(r["hidden"]),
                     f"{r['points']}/{r['max']}" + (f"   {r['note']}" if r["note"] else "")))
    rows.append(("total", "", "", f"{got}/{top}"))
    width = max(len(r[0]) for r in rows) + 3
    return "\n".join(f"{a:<{width}}{b:<9}{c:<9}{d}" for a, b, c, d in rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", nargs="+", metavar="NAME", help="grade only these parts")
    parser.add_argument("--all", action="store_true", help="grade every part, also those not assigned here")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--submission", metavar="DIR",
                        help="grade the part files in DIR, in a fresh copy of this tree")
    parser.add_argument("--time-limit", type=float, default=120, metavar="S",
                        help="seconds for each part's tests, process start included (default 120)")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="parts graded at the same time")
    # The child: run one part's tests, record them.
    parser.add_argument("--record", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        names = [assignment.part(n).name for n in args.part] if args.part else None
    except ValueError as e:
        parser.exit(2, f"course/grade.py: error: {e}\n")
    if args.record:
        if not names:
            parser.exit(2, "course/grade.py: error: --record needs --part\n")
        return run_tests(names, args.record)
    if names is None:
        names = [p.name for p in assignment.PARTS if args.all or assignment.ASSIGNED is None
                 or p.name in assignment.ASSIGNED]
    log = sys.stderr if args.json else sys.stdout
    files = None
    if args.submission:
        directory = Path(args.submission)
        if not directory.is_dir():
            parser.exit(2, f"course/grade.py: error: {directory} is not a directory\n")
        with tempfile.TemporaryDirectory(prefix="grade-submission-") as tmp:
            tree = Path(tmp)
            grading_tree(ROOT, tree)
            used, ignored, not_submitted = take_submission(directory, tree)
            results, problems = grade(tree, names, args.time_limit, args.jobs, not_submitted, log)
        files = dict(graded=used, ignored=ignored, not_submitted=not_submitted)
    else:
        results, problems = grade(ROOT, names, args.time_limit, args.jobs, log=log)
    if problems:
        parser.exit(2, "course/grade.py: cannot grade:\n  " + "\n  ".join(problems) + "\n")
    got = _number(round(sum(r["points"] for r in results.values()), 1))
    top = sum(r["max"] for r in results.values())
    hidden = any(r["hidden"] is not None for r in results.values())
    if args.json:
        print(json.dumps({"parts": results, "points": got, "max": top, "hidden_tests": hidden,
                          **({"files": files} if files else {})}))
    else:
        print("\n" + table(results, got, top))
        if files:
            print(f"\ngraded: {', '.join(files['graded']) or 'nothing'}"
                  + (f"\nnot submitted: {', '.join(files['not_submitted'])}"
                     if files["not_submitted"] else "")
                  + (f"\nignored (not part files, neither copied nor used): {', '.join(files['ignored'])}"
                     if files["ignored"] else ""))
        print("(visible and hidden tests)" if hidden else "(visible tests only)")
    return 0 if got == top else 1


if __name__ == "__main__":
    sys.exit(main())
