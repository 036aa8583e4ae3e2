"""The course kit: make_assignment.py writes a student copy and an answer key, and grade.py
scores each part alone, from the instructor's tree, whatever a submission does.

The isolation check (slow): for every part, a copy with that part alone blanked grades 0 on
it and full points on every other part; the answer key grades full points, hidden tests
included; a copy with every part blanked grades 0 everywhere and the grader does not crash.
Each copy's tests run in one process here (``grade.py --record``), scored by grade.score.
Then submissions graded end to end with ``grade.py --submission`` from an answer key.
Instructor-only: left out of the student's copy (assignment.HIDDEN_TESTS).
"""
import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from course import answers
from course import assignment
from course import grade
from course import make_assignment
from course import targets

ROOT = Path(__file__).resolve().parents[1]
NAMES = [p.name for p in assignment.PARTS]


def grade_in_one_process(copy):
    """Every part's tests of a copy in one process, scored as grade.py scores them."""
    record = copy.parent / f"{copy.name}-record.jsonl"
    run = subprocess.run([sys.executable, "-m", "course.grade", "--record", str(record), "--part", *NAMES],
                         cwd=copy, capture_output=True, text=True, timeout=600)
    lines = grade.read_record(record)
    assert any("finished" in line for line in lines), run.stdout[-3000:] + run.stderr[-3000:]
    parts = {}
    for name in NAMES:
        hidden = (copy / assignment.HIDDEN_GRADED_TESTS / f"test_{name}.py").exists()
        parts[name], problems = grade.score(name, lines, False, hidden, 0)
        assert not problems, problems
    return parts


@pytest.fixture(scope="module")
def grades(tmp_path_factory):
    """Every copy of the isolation check, made and graded (two at a time)."""
    base = tmp_path_factory.mktemp("copies")
    make_assignment.make(base / "all", answer_key=base / "key")
    for name in NAMES:
        make_assignment.make(base / name, [name])
    copies = ["all", "key"] + NAMES
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(copies, pool.map(grade_in_one_process, [base / c for c in copies])))


def full(part):
    return (part["points"] == part["max"] and part["visible"]["passed"] == part["visible"]["total"] > 0
            and (part["hidden"] is None or part["hidden"]["passed"] == part["hidden"]["total"] > 0))


@pytest.mark.slow
def test_the_answer_key_grades_full_points_hidden_tests_included(grades):
    result = grades["key"]
    assert set(result) == set(NAMES)
    for name, part in result.items():
        assert full(part) and part["hidden"] is not None, (name, part)


@pytest.mark.slow
def test_every_part_blanked_grades_zero_everywhere(grades):
    result = grades["all"]
    assert {n: (p["visible"]["passed"], p["points"], p["hidden"]) for n, p in result.items()} == \
        {n: (0, 0, None) for n in NAMES}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_blanking_one_part_costs_that_part_alone(grades, name):
    result = grades[name]
    assert result[name]["points"] == 0 and result[name]["visible"]["passed"] == 0
    for other, part in result.items():
        if other != name:
            assert full(part), f"blanking {name} cost {other} points: {part}"


# ----------------------------------------------------------------------------------------
# What the student receives

@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("hw") / "hw"
    make_assignment.make(out, ["aggregation", "extract_answer"])
    return out


def test_student_copy_has_no_history_no_hidden_tests_and_no_solutions(copy):
    assert not (copy / ".git").exists() and not (copy / "runs").exists()
    for name in assignment.INSTRUCTOR_ONLY:
        assert not (copy / name).exists(), name
    losses, rewards = (copy / "losses.py").read_text(), (copy / "rewards.py").read_text()
    assert "SOLUTION" not in losses + rewards                     # every marker line is gone
    assert "return x.sum() / mask.sum().clamp(min=1)" not in losses
    assert losses.count('raise NotImplementedError("aggregation:') == 2
    assert rewards.count('raise NotImplementedError("extract_answer:') == 2
    assert "def group_advantages(rewards, group_size, scale_std=True):" in losses   # other parts intact
    assert "r.std(dim=1, keepdim=True)" in losses
    ast.parse(losses)
    ast.parse(rewards)
    assert "ASSIGNED = ('aggregation', 'extract_answer')" in (copy / "course" / "assignment.py").read_text()


def test_files_without_parts_are_copied_unchanged(copy):
    for name in ("data.py", "docs/figures/tiny/summary.png", "tests/graded/test_aggregation.py",
                 "tests/fixtures/tiny_gsm8k.jsonl"):
        assert (copy / name).read_bytes() == (ROOT / name).read_bytes(), name


def test_links_in_the_student_copy_resolve(copy):
    """Links to the files it leaves out (the hidden tests) become plain text."""
    for doc in [copy / "README.md", copy / "HANDOUT.md", *sorted((copy / "docs").glob("*.md"))]:
        for target in make_assignment.LINK.findall(doc.read_text()):
            path = target[1].split("#")[0]
            if path and not path.startswith(("http:", "https:", "mailto:")):
                assert (doc.parent / path).exists(), f"{doc.name} links to {path}"
    links = [target for _, target in make_assignment.LINK.findall((copy / "README.md").read_text())]
    assert not [t for t in links if t.endswith("test_losses.py")]


def test_handout_describes_each_assigned_part(copy):
    handout = (copy / "HANDOUT.md").read_text()
    assert "## 1. `aggregation` (10 points)" in handout and "## 2. `extract_answer` (10 points)" in handout
    assert "def aggregate(x, mask, agg, max_tokens=None):" in handout            # signature and docstring
    assert "python -m course.grade --part extract_answer" in handout
    assert "`ValueError` mentioning `unknown aggregation`" in handout
    assert "group_advantages" not in handout.split("## 1.")[1]                   # not assigned


def test_the_student_readme_is_the_students(copy):
    """Its reading order runs nothing that raises and names no hidden file, its pitfalls cite
    tests the copy has, and "For instructors" is not in it."""
    readme = (copy / "README.md").read_text()
    assert "## For instructors" not in readme and "#for-instructors" not in readme
    assert "make_assignment" not in readme and "course.md" not in readme
    order = readme.split("## Reading order")[1].split("\n## ")[0]
    assert "HANDOUT.md" in order.split("\n2.")[0] and "python losses.py" not in order
    assert "tests/hidden" not in readme and "test_losses" not in readme
    assert "(instructor's copy only)" not in readme
    in_the_copy = {name for path in (copy / "tests").rglob("*.py")
                   for name in re.findall(r"def (test_\w+)", path.read_text())}
    cited = set(re.findall(r"`(test_\w+)`", readme))
    assert len(cited) >= 6 and cited <= in_the_copy, cited - in_the_copy
    assert "history holds" not in readme
    assert readme.startswith("# tokenreg-grpo\n\n> **This is your copy of the assignment.**")


def test_the_handout_asks_for_deliverables(copy):
    handout = (copy / "HANDOUT.md").read_text()
    for heading in ("## Grading", "## Files, and what each part depends on", "## What to submit",
                    "## Libraries", "## Once every part passes", "## Experiments", "### 1. On policy",
                    "### 4. The four losses"):
        assert heading in handout, heading
    assert ("`selective_log_softmax`" in handout and "make demo-tiny" in handout
            and "0.000 → 0.446" in handout and "### 5. Evidence" in handout)
    assert "| `rewards.py` | `extract_answer` | alone" in handout
    assert handout.count("**Sanity target") == 5 and handout.count("**Plot:**") == 4
    assert handout.count("**Table:**") == 1
    import train
    fields = dataclasses.fields(train.Config)
    flags = ({f.name.replace("_", "-") for f in fields} | {"seeds", "help", "losses"}   # compare.py's
             | {"table"}                                                              # plots.py's
             | {"no-" + f.name.replace("_", "-") for f in fields if f.type in (bool, "bool")})
    used = set(re.findall(r"(?<![\w-])--([a-z][a-z-]+)", handout.split("## Experiments")[1]))
    assert {"beta", "agg", "no-scale-std", "updates-per-batch"} <= used and used <= flags, used - flags


def test_copies_hold_tracked_files_only(tmp_path):
    """An instructor's untracked notes stay out of both copies; outside git, every file is copied."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("a.py", "docs/b.md", "notes.txt", "runs/x.json"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x")
    git = lambda *args: subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    git("init", "-q")
    git("add", "a.py", "docs/b.md")
    assert make_assignment.repo_files(repo) == ["a.py", "docs/b.md"]
    shutil.rmtree(repo / ".git")
    assert make_assignment.repo_files(repo) == ["a.py", "docs/b.md", "notes.txt"]


def test_every_graded_test_file_is_marked_with_its_part():
    files = sorted((ROOT / assignment.GRADED_TESTS).glob("test_*.py"))
    assert [f.name for f in files] == sorted(f"test_{n}.py" for n in NAMES)
    for p in assignment.PARTS:
        text = (ROOT / assignment.graded_tests_of(p)).read_text()
        assert f'pytestmark = pytest.mark.part("{p.name}")' in text, p.name
        assert text.count("mark.part(") == 1, p.name


# ----------------------------------------------------------------------------------------
# The experiments: points, model answers, rubric, sanity targets (issue 110)

EXPERIMENTS_TEXT = (ROOT / targets.EXPERIMENTS).read_text()


def test_the_answer_key_has_a_model_answer_and_rubric_for_every_question(kit):
    """Every question docs/experiments.md asks, and every plot or table it asks for, has a model
    answer and a rubric line in the key's ANSWERS.md; the student's copy has neither."""
    hw, key = kit
    asked = answers.questions_in(EXPERIMENTS_TEXT)
    assert sorted(asked) == ["1", "2", "3", "4", "5"] and all(len(q) == 3 for q in asked.values())
    have = {}
    for q in answers.QUESTIONS:
        have.setdefault(q.experiment, []).append(q.label)
    for n, labels in asked.items():
        assert sorted(x for x in have[n] if x.startswith("(")) == [f"({x})" for x in labels], n
        assert [x for x in have[n] if not x.startswith("(")] in (["plot"], ["table"]), n
    text = (key / "ANSWERS.md").read_text()
    assert "| experiment | question | points | what earns them |" in text
    for q in answers.QUESTIONS:
        assert f"| {q.experiment} | {q.label} | {answers.points(q)} | {answers.cell(q.rubric)} |" in text
        assert q.answer.split("{")[0][:60] in text
    assert "{" not in text.replace("\\boxed{}", "")           # every value filled in
    assert sum(answers.points(q) for q in answers.QUESTIONS) == assignment.EXPERIMENT_POINTS == 30
    assert assignment.CODE_POINTS + assignment.EXPERIMENT_POINTS == 100
    assert not (hw / "ANSWERS.md").exists() and not (hw / "course" / "answers.py").exists()
    assert "Rubric" not in (hw / "HANDOUT.md").read_text()


def test_the_handout_total_includes_the_write_up(kit):
    hw, _ = kit
    handout = (hw / "HANDOUT.md").read_text()
    assert "**Points: 100 in all.** The code is 70: the parts' 100 points below" in handout
    assert "The experiments are 30: your write-up" in handout
    assert "## Experiments (30 points)" in handout
    for n in "12345":
        assert re.search(rf"(?m)^### {n}\. .* \({answers.experiment_points(n)} points\)$", handout), n


def test_grade_says_the_experiments_are_the_instructors(tmp_path):
    """The table grade.py prints ends with the split (here with no part: 0 of 0)."""
    run = subprocess.run([sys.executable, "-m", "course.grade", "--part", "completion_mask"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert "of the grade's 70 points for code" in run.stdout
    assert "The experiments' 30 points are not graded here: they are the instructor's to give" in run.stdout


def test_every_sanity_target_and_the_compute_table_are_drawn_from_the_logs():
    """docs/experiments.md as it is: each target and the compute table are the ones course/targets.py
    draws from logs/ and the documents it quotes (python -m course.targets --write rewrites them)."""
    assert targets.problems(EXPERIMENTS_TEXT) == []
    v = targets.values()
    assert v["e4_heldout"] == "0.39–0.48" and v["e4_entropy_start"] == "0.30–0.31"   # issue 110's example
    for n, template in targets.TARGETS.items():
        assert targets.stray_numbers(template, targets.SETTINGS[n]) == [], n
    assert targets.stray_numbers(targets.COMPUTE, targets.SETTINGS["compute"]) == []
    assert answers.typed_numbers() == {}


def test_experiment_4s_range_is_the_one_results_md_draws():
    """The held-out range of experiment 4 agrees with docs/results.md's per-seed table, which
    experiments/tables.py writes from the same logs."""
    import plots
    from experiments import tables
    runs = [plots.read_run(d) for d in sorted((ROOT / targets.TINY).iterdir()) if d.is_dir()]
    table = tables.per_seed_table(runs)
    finals = [float(x) for loss in ("grpo", "tr_grpo", "tepo")
              for x in re.findall(r"(\d\.\d{3}) \(", next(row for row in table.splitlines()
                                                          if row.startswith(f"| {loss} |")))]
    assert targets.span(finals) == targets.values()["e4_heldout"]
    assert table in (ROOT / "docs" / "results.md").read_text()


def stale_root(tmp_path):
    """A tree with the documents and logs the targets are drawn from."""
    root = tmp_path / "root"
    for name in ("docs/experiments.md", "docs/results.md", "docs/performance.md", "docs/LOG.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / targets.TINY, root / targets.TINY)
    return root


def test_a_stale_target_turns_red_and_is_never_handed_out(tmp_path):
    """A hand-typed number that disagrees with its source (the old 0.41–0.50 of experiment 4), a
    log that changes under a target, and a document that changes a quoted measurement, each make
    the check fail; make_assignment then refuses to write a handout."""
    root = stale_root(tmp_path)
    assert targets.problems(EXPERIMENTS_TEXT, root) == []
    old = EXPERIMENTS_TEXT.replace("end at\n0.39–0.48", "end at\n0.41–0.50")
    assert old != EXPERIMENTS_TEXT
    assert any("experiment 4" in p for p in targets.problems(old, root))
    (root / targets.EXPERIMENTS).write_text(old)
    with pytest.raises(make_assignment.AssignmentError, match="experiment 4"):
        make_assignment.handout(root, [assignment.part("tepo")])

    log = stale_root(tmp_path / "log")              # a shipped run that ends elsewhere
    metrics = log / targets.TINY / "tepo-s0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('{"step": 150, "eval_accuracy": 0.484',
                                                   '{"step": 150, "eval_accuracy": 0.512'))
    found = targets.problems(EXPERIMENTS_TEXT, log)
    assert any("experiment 4" in p for p in found) and any("experiment 5" in p for p in found)

    doc = stale_root(tmp_path / "doc")              # a re-measured time in results.md
    results = doc / "docs" / "results.md"
    results.write_text(results.read_text().replace("CPU: 24 min in all", "CPU: 31 min in all"))
    assert any("compute table" in p for p in targets.problems(EXPERIMENTS_TEXT, doc))
    (doc / "docs" / "LOG.md").write_text("nothing quoted here\n")
    with pytest.raises(targets.StaleTarget, match="docs/LOG.md no longer says"):
        targets.problems(EXPERIMENTS_TEXT, doc)


def test_the_kits_copies_carry_the_fixed_contradictions(kit):
    """_TokenLogprobs is optional wherever it is named; no shape is [B, T] (T is the temperature);
    the lookup-table bound reads the same in the handout and docs/course.md (the visible share)."""
    hw, key = kit
    handout = (hw / "HANDOUT.md").read_text()
    row = next(line for line in handout.splitlines() if line.startswith("| `token_logprobs` |"))
    write, optional = row.split("optional, not graded:")
    assert "_TokenLogprobs" not in write and "`_TokenLogprobs.forward`" in optional
    assert "[B, T]" not in handout
    for path in [*hw.rglob("*.py"), *hw.rglob("*.md")]:
        assert "[B, T]" not in path.read_text(), path
    share = 1 - assignment.HIDDEN_SHARE
    assert f"earns at most the visible tests' {share:.0%} of a part" in handout
    course = " ".join((key / "docs" / "course.md").read_text().split())
    assert f"at most its visible tests' share, {10 * share:g} of 10" in course
    assert "at most 3 of 10" not in course


# ----------------------------------------------------------------------------------------
# Submissions, graded end to end from an answer key: `grade.py --submission DIR --json`

INDEPENDENT_MASK = """    rows, mask, stopped = completions.tolist(), torch.zeros(completions.shape), []
    for i, row in enumerate(rows):                  # written apart from the key: a loop, not tensors
        end = next((t for t, token in enumerate(row) if token in eos), None)
        mask[i, :len(row) if end is None else end + 1] = 1.0
        stopped.append(end is not None)
    return mask.to(completions.device), ~torch.tensor(stopped, dtype=torch.bool)
"""


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    base = tmp_path_factory.mktemp("kit")
    make_assignment.make(base / "hw", answer_key=base / "key")
    return base / "hw", base / "key"


def write_part(copy, file, part, body):
    """The student copy's ``file`` with the first unwritten body of ``part`` replaced by ``body``."""
    text = (copy / file).read_text()
    line = f'    raise NotImplementedError("{part}: write this part (see HANDOUT.md)")\n'
    assert line in text
    return text.replace(line, body, 1)


def submit(key, submission, *args):
    run = subprocess.run([sys.executable, "-m", "course.grade", "--submission", str(submission), "--json",
                          *args], cwd=key, capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    return json.loads(run.stdout), run


@pytest.mark.slow
def test_a_submission_is_graded_by_the_grader_not_by_its_own_output(kit, tmp_path):
    """A correct completion_mask written independently: full points, hidden tests included. A
    lookup table of the visible extract_answer cases: at most the visible tests' share (2.5 of
    10), as the handout and docs/course.md say. A losses.py that prints a forged full-marks JSON
    at import and exits: nothing for its parts. Other files: listed."""
    hw, key = kit
    sub = tmp_path / "alice"
    sub.mkdir()
    forged = json.dumps({"parts": {n: {"points": 15, "max": 15} for n in NAMES}, "points": 100, "max": 100})
    (sub / "losses.py").write_text(f"import sys\nprint({forged!r})\nsys.exit(0)\n"
                                   + (hw / "losses.py").read_text())
    cases = ast.literal_eval(re.search(r"(?ms)^CASES = (\[.*?^\])",
                                       (hw / "tests/graded/test_extract_answer.py").read_text())[1])
    (sub / "rewards.py").write_text((hw / "rewards.py").read_text()
                                    + f"\nCASES = {cases!r}\nextract_answer = lambda t: dict(CASES).get(t)\n")
    (sub / "train.py").write_text(write_part(hw, "train.py", "completion_mask", INDEPENDENT_MASK))
    (sub / "helpers.py").write_text("def mask(): ...\n")
    (sub / "notes.txt").write_text("thanks\n")
    result, run = submit(key, sub, "--part", "group_advantages", "tepo", "extract_answer", "completion_mask")
    parts = result["parts"]
    assert parts["completion_mask"]["points"] == 5 and full(parts["completion_mask"])
    assert parts["completion_mask"]["hidden"]["total"] > 0
    assert parts["group_advantages"]["points"] == 0 and parts["tepo"]["points"] == 0
    visible_share = 10 * (1 - assignment.HIDDEN_SHARE)
    assert 0 < parts["extract_answer"]["points"] <= visible_share
    assert parts["extract_answer"]["hidden"]["passed"] == 0
    assert result["points"] == 5 + parts["extract_answer"]["points"] and result["hidden_tests"] is True
    assert result["files"] == {"graded": ["losses.py", "rewards.py", "train.py"],
                               "ignored": ["helpers.py", "notes.txt"], "not_submitted": [], "refused": {}}
    assert result["tree_changed"] == []
    assert result["grade"] == {"code": assignment.course_points(result["points"], result["max"]),
                               "code_max": 70, "experiments": None, "experiments_max": 30,
                               "experiments_by": "the instructor, from the write-up"}
    assert forged in run.stderr and forged not in run.stdout       # its output is shown, never read


@pytest.mark.slow
def test_a_syntax_error_costs_its_own_file_and_a_missing_file_its_parts(kit, tmp_path):
    hw, key = kit
    sub = tmp_path / "bob"
    sub.mkdir()
    (sub / "losses.py").write_text((hw / "losses.py").read_text().replace("def k3(", "def k3((", 1))
    (sub / "train.py").write_text(write_part(hw, "train.py", "completion_mask", INDEPENDENT_MASK))
    result, _ = submit(key, sub, "--part", "grpo_loss", "completion_mask", "extract_answer")
    parts = result["parts"]
    assert parts["completion_mask"]["points"] == 5 and full(parts["completion_mask"])
    assert parts["grpo_loss"]["points"] == 0 and "could not import" in parts["grpo_loss"]["note"]
    assert parts["extract_answer"] == {"points": 0, "max": 10, "visible": None, "hidden": None,
                                       "note": "rewards.py was not submitted"}
    assert result["files"]["not_submitted"] == ["rewards.py"]


@pytest.mark.slow
def test_a_part_that_hangs_is_stopped_at_the_time_limit(kit, tmp_path):
    hw, key = kit
    sub = tmp_path / "carol"
    sub.mkdir()
    # An endless loop at import.
    (sub / "rewards.py").write_text((hw / "rewards.py").read_text() + "\nwhile True:\n    pass\n")
    result, _ = submit(key, sub, "--part", "extract_answer", "--time-limit", "10")
    part = result["parts"]["extract_answer"]
    assert part["points"] == 0 and "time limit (10 s)" in part["note"]


# ----------------------------------------------------------------------------------------
# A hostile submission (issue 109): links, floods, writes into the key

@pytest.mark.slow
def test_a_linked_file_or_folder_is_refused_never_followed(kit, tmp_path):
    """The layout docs/course.md describes (../hw-key beside ../alice): a losses.py that links to the
    key's losses.py scored 85/100 with no code written. Links are refused with the reason, their
    parts score 0, and so does a part file inside a linked folder."""
    hw, key = kit
    sub = tmp_path / "mallory"
    sub.mkdir()
    (sub / "losses.py").symlink_to(key / "losses.py")                   # absolute
    (sub / "rewards.py").symlink_to(os.path.relpath(key / "rewards.py", sub))   # relative, out of it
    (sub / "keyfolder").symlink_to(key, target_is_directory=True)
    (sub / "train.py").write_text(write_part(hw, "train.py", "completion_mask", INDEPENDENT_MASK))
    result, run = submit(key, sub, "--part", "group_advantages", "extract_answer", "completion_mask")
    parts = result["parts"]
    assert parts["group_advantages"]["points"] == 0 and parts["extract_answer"]["points"] == 0
    assert "refused: a symbolic link" in parts["group_advantages"]["note"]
    assert parts["completion_mask"]["points"] == 5
    assert result["files"]["graded"] == ["train.py"]
    assert set(result["files"]["refused"]) == {"losses.py", "rewards.py", "keyfolder/"}
    assert all("symbolic link" in why for why in result["files"]["refused"].values())
    table = subprocess.run([sys.executable, "-m", "course.grade", "--submission", str(sub), "--part",
                            "group_advantages"], cwd=key, capture_output=True, text=True, timeout=600)
    assert "refused (only regular files inside the submission are read): losses.py" in table.stdout


def test_only_regular_files_inside_the_submission_are_read(tmp_path):
    """read_submission, alone: links (to files and folders) and special files are refused."""
    sub, outside = tmp_path / "sub", tmp_path / "outside"
    (sub / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "losses.py").write_text("SOLUTION = 1\n")
    (outside / "train.py").write_text("SOLUTION = 1\n")
    (sub / "rewards.py").write_text("mine = 1\n")
    (sub / "losses.py").symlink_to(outside / "losses.py")
    (sub / "linked").symlink_to(outside, target_is_directory=True)
    (sub / "deep" / "notes.txt").write_text("x")
    os.mkfifo(sub / "train.py")
    taken, ignored, refused, not_submitted = grade.read_submission(sub)
    assert taken == {"rewards.py": b"mine = 1\n"}
    assert ignored == ["deep/notes.txt"] and not_submitted == []
    assert set(refused) == {"losses.py", "linked/", "train.py"}
    assert refused["train.py"] == "not a regular file"


FLOOD = ("import sys\nsys.stdout.write('x' * 2_000_000)\nsys.stderr.write('y' * 2_000_000)\n"
         "raise RuntimeError('boom')\n")


@pytest.mark.slow
def test_a_flood_of_output_is_echoed_capped(kit, tmp_path):
    """A submission that printed 10 MB and raised made 140 MB of grader output; now each part's
    output is its first and last OUTPUT_CAP / 2 bytes, with what was cut counted."""
    hw, key = kit
    sub = tmp_path / "flood"
    sub.mkdir()
    (sub / "losses.py").write_text(FLOOD + (hw / "losses.py").read_text())
    result, run = submit(key, sub, "--part", "group_advantages", "aggregation")
    assert result["parts"]["group_advantages"]["points"] == 0
    assert len(run.stderr) < 3 * grade.OUTPUT_CAP, len(run.stderr)
    assert run.stderr.count("bytes of output cut") == 2


def test_run_capped_keeps_the_head_and_the_tail(tmp_path):
    code = "import sys\nsys.stdout.write('HEAD' + 'x' * 100_000 + 'TAIL')\nsys.stdout.flush()\n"
    output, timed_out = grade.run_capped([sys.executable, "-c", code], tmp_path, None, 60, cap=1000)
    assert not timed_out and output.startswith("HEAD") and output.endswith("TAIL")
    assert "[... 99008 bytes of output cut" in output and len(output) < 1200
    output, timed_out = grade.run_capped([sys.executable, "-c", "import time; print('hi', flush=True); "
                                          "time.sleep(60)"], tmp_path, None, 2)
    assert timed_out and output == "hi\n"


TAMPER = """import os, pathlib
FAKE = 'import pytest\\npytestmark = pytest.mark.part("extract_answer")\\ndef test_given():\\n    pass\\n'
grader = f"/proc/{os.getppid()}/cwd"                            # where the grader was started: the key
for base in {os.environ.get("PWD", ""), os.getcwd(), os.path.realpath(grader)}:
    tests = pathlib.Path(base) / "tests"
    for name in ("graded/test_extract_answer.py", "hidden/test_extract_answer.py"):
        if (tests / name).exists():
            (tests / name).write_text(FAKE)
    if (tests / "hidden").is_dir():
        (tests / "hidden" / "planted.txt").write_text("x")
"""


@pytest.mark.slow
def test_a_submission_cannot_change_the_key_or_another_parts_grading(tmp_path):
    """losses.py rewrites, at import, extract_answer's tests wherever it finds them: in its own
    tree, and in the directory the grader was started from (the answer key: PWD no longer names
    it, the grader's /proc entry still does). Each part is graded in its own copy, made before
    any submitted code ran, so extract_answer (unwritten) still scores 0, and the key's change is
    found and reported (exit status 2)."""
    if not Path("/proc/self/cwd").exists():
        pytest.skip("finds the grader's directory through /proc")
    base = tmp_path / "k"
    make_assignment.make(base / "hw", answer_key=base / "key")
    hw, key = base / "hw", base / "key"
    before = grade.fingerprint(key)
    sub = tmp_path / "eve"
    sub.mkdir()
    (sub / "losses.py").write_text(TAMPER + (hw / "losses.py").read_text())
    (sub / "rewards.py").write_text((hw / "rewards.py").read_text())
    run = subprocess.run([sys.executable, "-m", "course.grade", "--submission", str(sub), "--json",
                          "--jobs", "1",
                          "--part", "group_advantages", "extract_answer"], cwd=key, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PWD": str(key)})
    result = json.loads(run.stdout)
    assert result["parts"]["extract_answer"]["points"] == 0
    assert result["parts"]["extract_answer"]["visible"]["total"] > 1
    assert run.returncode == 2 and "this tree changed while the submission ran" in run.stderr
    assert sorted(result["tree_changed"]) == [
        "tests/graded/test_extract_answer.py (changed)", "tests/hidden/planted.txt (added)",
        "tests/hidden/test_extract_answer.py (changed)"]
    assert grade.changed(before, grade.fingerprint(key)) == result["tree_changed"]


# ----------------------------------------------------------------------------------------
# Clear errors

def test_refuses_a_non_empty_directory_and_unknown_parts(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    for argv, message in [(["--out", str(tmp_path / "taken")], "exists and is not empty"),
                          (["--out", str(tmp_path / "new"), "--parts", "ppo"], "unknown part 'ppo'"),
                          (["--out", str(ROOT / "hw")], "inside the repo")]:
        with pytest.raises(SystemExit) as exit_:
            make_assignment.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    for argv in (["--out", str(tmp_path / "hw"), "--answer-key", str(tmp_path / "hw" / "key")],
                 ["--out", str(tmp_path / "key" / "hw"), "--answer-key", str(tmp_path / "key")]):
        with pytest.raises(SystemExit) as exit_:      # a key inside the student's copy, or around it
            make_assignment.main(argv)
        assert exit_.value.code == 2 and "is inside" in capsys.readouterr().err
        assert not (tmp_path / "hw").exists() and not (tmp_path / "key").exists()
    assert "group_advantages, aggregation, grpo_loss" in str(
        pytest.raises(ValueError, assignment.part, "ppo").value)
    assert not (tmp_path / "new").exists() and (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_a_part_without_markers_is_named(tmp_path):
    src = tmp_path / "src"
    for name in ("course/assignment.py", "losses.py", "rewards.py", "train.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    text = (src / "rewards.py").read_text()
    (src / "rewards.py").write_text(text.replace("    # BEGIN SOLUTION extract_answer\n", "", 1))
    with pytest.raises(make_assignment.AssignmentError, match="END SOLUTION without a BEGIN"):
        make_assignment.make(tmp_path / "out", ["extract_answer"], root=src)
    (src / "rewards.py").write_text(text.replace("# BEGIN SOLUTION extract_answer", "#").replace(
        "# END SOLUTION", "#"))
    with pytest.raises(make_assignment.AssignmentError,
                       match="part 'extract_answer' has no solution region in rewards.py"):
        make_assignment.make(tmp_path / "out", ["extract_answer"], root=src)
    assert not (tmp_path / "out").exists()


def test_grade_rejects_an_unknown_part():
    run = subprocess.run([sys.executable, "-m", "course.grade", "--part", "ppo"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2 and "unknown part 'ppo'" in run.stderr and "tepo" in run.stderr
