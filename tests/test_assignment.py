"""The course kit: make_assignment.py writes a student copy that grade.py scores correctly.

The isolation check (slow, about a minute): for every part, a copy with that part alone
blanked grades 0 on it and full points on every other part; the answer key grades full
points; a copy with every part blanked grades 0 everywhere and the grader does not crash.
Instructor-only: left out of the student's copy (assignment.HIDDEN_TESTS).
"""
import ast
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import assignment
import make_assignment

ROOT = Path(__file__).resolve().parents[1]
NAMES = [p.name for p in assignment.PARTS]


def grade(copy):
    """``python grade.py --all --json`` in a copy: the parsed JSON object."""
    run = subprocess.run([sys.executable, "grade.py", "--all", "--json"], cwd=copy, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def grades(tmp_path_factory):
    """Every copy of the isolation check, made and graded (two at a time)."""
    base = tmp_path_factory.mktemp("copies")
    make_assignment.make(base / "all", answer_key=base / "key")
    for name in NAMES:
        make_assignment.make(base / name, [name])
    copies = ["all", "key"] + NAMES
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(copies, pool.map(grade, [base / c for c in copies])))


def full(part):
    return {"passed": part["total"], "total": part["total"], "points": part["max"], "max": part["max"]}


@pytest.mark.slow
def test_the_answer_key_grades_full_points(grades):
    result = grades["key"]
    assert set(result["parts"]) == set(NAMES)
    for name, part in result["parts"].items():
        assert part["total"] > 0 and part == full(part), name
    assert result["points"] == result["max"] == assignment.MAX_POINTS


@pytest.mark.slow
def test_every_part_blanked_grades_zero_everywhere(grades):
    result = grades["all"]
    assert {n: (p["passed"], p["points"]) for n, p in result["parts"].items()} == {n: (0, 0) for n in NAMES}
    assert result["points"] == 0 and result["max"] == assignment.MAX_POINTS


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_blanking_one_part_costs_that_part_alone(grades, name):
    result = grades[name]
    assert result["parts"][name]["points"] == 0 and result["parts"][name]["passed"] == 0
    for other, part in result["parts"].items():
        if other != name:
            assert part == full(part), f"blanking {name} cost {other} points: {part}"
    assert result["points"] == assignment.MAX_POINTS - assignment.part(name).points


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
    assert "ASSIGNED = ('aggregation', 'extract_answer')" in (copy / "assignment.py").read_text()


def test_files_without_parts_are_copied_unchanged(copy):
    for name in ("data.py", "docs/summary.png", "tests/graded/test_aggregation.py", "tests/fixtures/tiny_gsm8k.jsonl"):
        assert (copy / name).read_bytes() == (ROOT / name).read_bytes(), name


def test_links_in_the_student_copy_resolve(copy):
    """Links to the files it leaves out (the hidden tests) become plain text."""
    for doc in [copy / "README.md", *sorted((copy / "docs").glob("*.md"))]:
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
    assert "python grade.py --part extract_answer" in handout
    assert "`ValueError` mentioning `unknown aggregation`" in handout
    assert "group_advantages" not in handout.split("## 1.")[1]                   # not assigned


def test_every_graded_test_file_is_marked_with_its_part():
    files = sorted((ROOT / assignment.GRADED_TESTS).glob("test_*.py"))
    assert [f.name for f in files] == sorted(f"test_{n}.py" for n in NAMES)
    for p in assignment.PARTS:
        text = (ROOT / assignment.graded_tests_of(p)).read_text()
        assert f'pytestmark = pytest.mark.part("{p.name}")' in text, p.name
        assert text.count("mark.part(") == 1, p.name


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
    assert "group_advantages, aggregation, grpo_loss" in str(pytest.raises(ValueError, assignment.part, "ppo").value)
    assert not (tmp_path / "new").exists() and (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_a_part_without_markers_is_named(tmp_path):
    src = tmp_path / "src"
    for name in ("assignment.py", "losses.py", "rewards.py", "train.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    text = (src / "rewards.py").read_text()
    (src / "rewards.py").write_text(text.replace("    # BEGIN SOLUTION extract_answer\n", "", 1))
    with pytest.raises(make_assignment.AssignmentError, match="END SOLUTION without a BEGIN"):
        make_assignment.make(tmp_path / "out", ["extract_answer"], root=src)
    (src / "rewards.py").write_text(text.replace("# BEGIN SOLUTION extract_answer", "#").replace(
        "# END SOLUTION", "#"))
    with pytest.raises(make_assignment.AssignmentError, match="part 'extract_answer' has no solution region in rewards.py"):
        make_assignment.make(tmp_path / "out", ["extract_answer"], root=src)
    assert not (tmp_path / "out").exists()


def test_grade_rejects_an_unknown_part():
    run = subprocess.run([sys.executable, "grade.py", "--part", "ppo"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "unknown part 'ppo'" in run.stderr and "tepo" in run.stderr
