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
train.py) and lists anything else there as ignored. It reads only regular files inside DIR: a
symbolic link (to a file or a folder, inside DIR or out of it) or a special file is refused,
never followed, and listed with the reason; a refused part file scores 0 for its parts. Each
part is graded in a fresh copy of what grading needs from this tree (its Python files and
packages, pytest.ini, the graded and hidden tests), every copy made before any submitted code
runs, with the submitted files in place of the part files (a part file not submitted is left
out: its parts score 0). So what a submission writes into its copy dies with it, and never
reaches another part or a later grading. The files of this tree that the copies come from are
hashed before and after: a change (a submission that found this tree and wrote into it) is
reported, and the exit status is then 2. A part's output is echoed capped (``OUTPUT_CAP``:
its first and last characters, with what was cut counted).
Exit status: 0 full points, 1 points missing, 2 the grader could not grade, or this tree changed.

The points are the code's only. The grade is ``assignment.CODE_POINTS`` of code (these points,
scaled) and ``assignment.EXPERIMENT_POINTS`` of experiments, which are the instructor's to give
from the write-up, with the rubric of the answer key's ANSWERS.md; the table and the JSON
("grade") say so.
"""
import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course import assignment

ROOT = Path(__file__).resolve().parents[1]                # the repo root
SETS = {"visible": assignment.GRADED_TESTS, "hidden": assignment.HIDDEN_GRADED_TESTS}
PACKAGES = ("course", "engine")     # folders whose Python files a graded tree needs (train.py imports engine)
OUTPUT_CAP = 20_000                 # bytes of a part's output echoed: the first and the last half of it


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

def run_capped(command, cwd, env, time_limit, cap=OUTPUT_CAP):
    """Run ``command``; (its stdout and stderr, at most ``cap`` bytes of them, whether it timed out).

    The output is read as it comes and only its first and last ``cap // 2`` bytes are kept (a
    count of what was cut goes between them), so a child that prints gigabytes costs neither
    memory nor the grader's output. The child leads a process group of its own: at the time
    limit the whole group is killed, processes it started included."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    half, kept = cap // 2, {"head": b"", "tail": b"", "total": 0}

    def drain():
        for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):
            kept["total"] += len(chunk)
            take = max(0, half - len(kept["head"]))
            kept["head"] += chunk[:take]
            kept["tail"] = (kept["tail"] + chunk[take:])[-half:]
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=time_limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:                                  # what the child started and left behind goes with it (its group)
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    reader.join(timeout=10)
    proc.stdout.close()
    cut = kept["total"] - len(kept["head"]) - len(kept["tail"])
    middle = (f"\n[... {cut} bytes of output cut: the grader echoes the first and last {half} bytes ...]\n"
              .encode() if cut > 0 else b"")
    return (kept["head"] + middle + kept["tail"]).decode(errors="replace"), timed_out


def grade_part(tree, name, time_limit):
    """Run one part's child in ``tree``; its record (a list of dicts), output and whether it timed out."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        record = Path(tmp) / "record.jsonl"
        record.touch()
        command = [sys.executable, "-m", "course.grade", "--record", str(record), "--part", name]
        env = {k: v for k, v in os.environ.items() if k != "OLDPWD"}
        env.update(PYTHONDONTWRITEBYTECODE="1", PWD=str(tree))   # not the grader's directory: the key's
        output, timed_out = run_capped(command, tree, env, time_limit)
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


def grading_files(source):
    """What grading needs from ``source``, as relative paths: its Python files and those of
    PACKAGES, pytest.ini, and its graded and hidden tests (no runs, no logs, no other tests)."""
    names = [p.name for p in source.glob("*.py")] + ["pytest.ini"]
    names += [f"{package}/{p.name}" for package in PACKAGES for p in (source / package).glob("*.py")]
    for folder in SETS.values():
        names += [p.relative_to(source).as_posix() for p in (source / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(n for n in set(names) if (source / n).is_file())


def grading_tree(source, dest):
    """A pristine copy of what grading needs from ``source`` (``grading_files``) in ``dest``."""
    for name in grading_files(source):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, dest / name)


def fingerprint(source):
    """{relative path: sha256} of the files the grading trees are copied from: compared before and
    after grading, it shows a submission that wrote into this tree (or added a file to it)."""
    return {n: hashlib.sha256((source / n).read_bytes()).hexdigest() for n in grading_files(source)}


def changed(before, after):
    """The files added, removed or changed between two fingerprints, each with what happened."""
    return sorted([f"{n} (changed)" for n in before.keys() & after.keys() if before[n] != after[n]]
                  + [f"{n} (added)" for n in after.keys() - before.keys()]
                  + [f"{n} (removed)" for n in before.keys() - after.keys()])


def read_regular(path):
    """The bytes of ``path`` if it is a regular file, never through a symbolic link; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None


def read_submission(directory):
    """The submission's files: ({part file: its bytes}, ignored names, {refused name: why}, not
    submitted part files). Only regular files inside ``directory`` are read: a symbolic link (to a
    file or a folder, wherever it points) or a special file is refused and never followed."""
    wanted = set(part_files())
    taken, ignored, refused = {}, [], {}
    for folder, dirs, files in os.walk(directory):           # does not enter linked folders
        here = Path(folder)
        for d in list(dirs):
            if (here / d).is_symlink():
                name = (here / d).relative_to(directory).as_posix()
                refused[name + "/"] = f"a symbolic link to {os.readlink(here / d)}: not followed"
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not (here / d).is_symlink())
        for f in sorted(files):
            path = here / f
            name = path.relative_to(directory).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                refused[name] = f"a symbolic link to {os.readlink(path)}: not followed"
            elif not stat.S_ISREG(mode):
                refused[name] = "not a regular file"
            elif name not in wanted:
                ignored.append(name)
            elif (data := read_regular(path)) is None:
                refused[name] = "not a regular file when read"
            else:
                taken[name] = data
    return taken, sorted(ignored), dict(sorted(refused.items())), sorted(wanted - set(taken) - set(refused))


def take_submission(taken, tree):
    """Put the submitted part files (``read_submission``'s bytes) into ``tree``; a part file not
    among them is removed, so its parts score 0 and no solution is left to call."""
    for name in part_files():
        (tree / name).unlink(missing_ok=True)
    for name, data in taken.items():
        (tree / name).write_bytes(data)


def grade(tree, names, time_limit, jobs, not_submitted=(), log=sys.stdout, refused=None):
    """Every part of ``names`` graded in ``tree`` (one tree for all, or {part: its own tree}):
    ({part: result}, problems). A part whose file was not submitted, or refused (``refused``:
    {file: why}), scores 0 without running."""
    tree_of = (lambda n: tree[n]) if isinstance(tree, dict) else (lambda n: tree)
    refused = refused or {}
    hidden_present = lambda n: (tree_of(n) / SETS["hidden"] / f"test_{n}.py").exists()
    missing = {n for n in names if assignment.part(n).file in set(not_submitted) | set(refused)}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = dict(zip(names, pool.map(
            lambda n: None if n in missing else grade_part(tree_of(n), n, time_limit), names)))
    results, problems = {}, []
    for name, run in runs.items():
        if run is None:
            file = assignment.part(name).file
            why = f"refused: {refused[file]}" if file in refused else "was not submitted"
            results[name] = dict(points=0, max=assignment.part(name).points, visible=None, hidden=None,
                                 note=f"{file} {why}")
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
    files, tampered = None, []
    if args.submission:
        directory = Path(args.submission)
        if directory.is_symlink() or not directory.is_dir():
            parser.exit(2, f"course/grade.py: error: {directory} is not a directory "
                           "(a link is not followed)\n")
        taken, ignored, refused, not_submitted = read_submission(directory)
        before = fingerprint(ROOT)
        with tempfile.TemporaryDirectory(prefix="grade-submission-") as tmp:
            trees = {}
            for name in names:                   # every copy made before any submitted code runs
                trees[name] = Path(tmp) / name
                trees[name].mkdir()
                grading_tree(ROOT, trees[name])
                take_submission(taken, trees[name])
            results, problems = grade(trees, names, args.time_limit, args.jobs, not_submitted, log, refused)
        tampered = changed(before, fingerprint(ROOT))
        files = dict(graded=sorted(taken), ignored=ignored, not_submitted=not_submitted, refused=refused)
    else:
        results, problems = grade(ROOT, names, args.time_limit, args.jobs, log=log)
    warning = ("course/grade.py: this tree changed while the submission ran (it found the tree and wrote "
               "into it): " + ", ".join(tampered) + ". This grading used copies made before any submitted "
               "code ran; restore these files (git checkout, or make the answer key again) before grading "
               "more, and read this submission.\n") if tampered else ""
    if problems:
        parser.exit(2, warning + "course/grade.py: cannot grade:\n  " + "\n  ".join(problems) + "\n")
    got = _number(round(sum(r["points"] for r in results.values()), 1))
    top = sum(r["max"] for r in results.values())
    hidden = any(r["hidden"] is not None for r in results.values())
    code = assignment.course_points(got, top)
    split = dict(code=code, code_max=assignment.CODE_POINTS, experiments=None,
                 experiments_max=assignment.EXPERIMENT_POINTS,
                 experiments_by="the instructor, from the write-up")
    if args.json:
        print(json.dumps({"parts": results, "points": got, "max": top, "hidden_tests": hidden,
                          "grade": split,
                          **({"files": files, "tree_changed": tampered} if files else {})}))
    else:
        print("\n" + table(results, got, top))
        if files:
            print(f"\ngraded: {', '.join(files['graded']) or 'nothing'}"
                  + (f"\nnot submitted: {', '.join(files['not_submitted'])}"
                     if files["not_submitted"] else "")
                  + (f"\nignored (not part files, neither copied nor used): {', '.join(files['ignored'])}"
                     if files["ignored"] else "")
                  + "".join(f"\nrefused (only regular files inside the submission are read): {name}, {why}"
                            for name, why in files["refused"].items()))
        print("(visible and hidden tests)" if hidden else "(visible tests only)")
        print(f"\nThe code: {got}/{top} → {code} of the grade's {assignment.CODE_POINTS} points for code. "
              f"The experiments' {assignment.EXPERIMENT_POINTS} points are not graded here: they are the "
              "instructor's to give, from the write-up (the rubric is in the answer key's ANSWERS.md).")
    if warning:
        print(warning, file=sys.stderr, end="")
        return 2
    return 0 if got == top else 1


if __name__ == "__main__":
    sys.exit(main())
