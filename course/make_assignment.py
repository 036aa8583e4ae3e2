"""Make the student's copy of this repo, and optionally the instructor's answer key.

    python -m course.make_assignment --out DIR                  # every part (assignment.py)
    python -m course.make_assignment --out DIR --parts aggregation tepo
    python -m course.make_assignment --out DIR --answer-key KEY  # also the instructor's copy

The student's copy is the repo's tracked files (``git ls-files``: an instructor's untracked
notes stay behind; outside git, every file but runs/ and caches) without .git, with:
  * each chosen part's marked region replaced by ``raise NotImplementedError("<part>: ...")``
    (signatures and docstrings kept) and the marker lines of the other parts removed;
  * the instructor's files left out (``assignment.INSTRUCTOR_ONLY``: the hidden tests, which
    would give answers away or only pass with the solutions, docs/course.md and this
    script), and markdown links to them turned into plain text;
  * a README that is the student's: its reading order starts from HANDOUT.md, its pitfalls
    cite tests the copy has, and its "For instructors" section is gone;
  * a HANDOUT.md generated from the parts: goal, signatures and docstrings, info keys,
    errors, points, the file each part lives in, what to submit, which libraries are
    allowed, what to expect once every part passes, the grade's split (code and write-up,
    ``assignment.CODE_POINTS`` and ``EXPERIMENT_POINTS``), and the experiments of
    docs/experiments.md with their points, refused when a sanity target there disagrees with the
    shipped logs (course/targets.py);
The answer key is the repo's tracked files as they are (solutions, markers, hidden tests),
without .git, with the same HANDOUT.md and an ANSWERS.md: a model answer and the rubric for every
experiment question (course/answers.py); both copies grade the same parts (``assignment.ASSIGNED``).
Nothing is written into a directory that exists and is not empty, and neither copy may be inside
the other.
"""
import argparse
import ast
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

from course import answers, assignment, targets

ROOT = Path(__file__).resolve().parents[1]                # the repo root
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")             # a markdown link: [text](target)
BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION (?P<part>\S+)\s*$")
END = re.compile(r"^(?P<indent>\s*)# END SOLUTION\s*$")
NOT_COPIED = {".git", "runs", "__pycache__", ".pytest_cache", ".benchmarks"}
EXPERIMENTS = "docs/experiments.md"          # the handout's experiments, with their sanity targets


class AssignmentError(Exception):
    """A problem the instructor must fix (bad option, missing or malformed markers)."""


# ----------------------------------------------------------------------------------------
# Which files make up the repo

def repo_files(root):
    """Relative paths of the repo's files: those git tracks (a new file is copied once it is
    added), or, outside a git checkout (an answer key), every file but runs/ and caches."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached"], cwd=root, capture_output=True, text=True,
                             check=True).stdout
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):           # no git, or not a git repo
        names = [str(p.relative_to(root)) for p in root.rglob("*")]
    keep = lambda n: not NOT_COPIED & set(Path(n).parts) and not n.endswith(".pyc") and (root / n).is_file()
    return sorted({Path(n).as_posix() for n in names if keep(n)})


# ----------------------------------------------------------------------------------------
# Solution regions

def regions(lines, path):
    """The marked regions of a file: [(part, begin line index, end line index, indent)]."""
    found, open_ = [], None
    for i, line in enumerate(lines):
        if m := BEGIN.match(line):
            if open_:
                raise AssignmentError(f"{path}:{i + 1}: BEGIN SOLUTION inside the region opened at line "
                                      f"{open_[1] + 1}")
            if m["part"] not in {p.name for p in assignment.PARTS}:
                raise AssignmentError(f"{path}:{i + 1}: unknown part {m['part']!r} (assignment.PARTS)")
            open_ = (m["part"], i, m["indent"])
        elif m := END.match(line):
            if not open_ or m["indent"] != open_[2]:
                raise AssignmentError(f"{path}:{i + 1}: END SOLUTION without a BEGIN SOLUTION "
                                      "at its indentation")
            found.append((open_[0], open_[1], i, open_[2]))
            open_ = None
    if open_:
        raise AssignmentError(f"{path}:{open_[1] + 1}: BEGIN SOLUTION {open_[0]} is never closed")
    return found


def functions(tree):
    """{qualified name: node} of a module's functions and methods ("Class.method")."""
    out = {}
    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out[name] = child
                visit(child, name + ".")
    visit(tree, "")
    return out


def check_part(part, root):
    """Each of the part's functions holds one of its regions, after the docstring."""
    text = (root / part.file).read_text(encoding="utf-8")
    lines = text.splitlines()
    own = [r for r in regions(lines, part.file) if r[0] == part.name]
    if not own:
        raise AssignmentError(
            f"part {part.name!r} has no solution region in {part.file}: mark it inside "
            f"{', '.join(part.functions)} with\n"
            f"    # BEGIN SOLUTION {part.name}\n"
            "    ...\n"
            "    # END SOLUTION")
    defs = functions(ast.parse(text))
    for name in part.functions:
        node = defs.get(name)
        if node is None:
            raise AssignmentError(f"part {part.name!r}: no function {name} in {part.file}")
        has_doc = ast.get_docstring(node) is not None
        after = node.body[0].end_lineno if has_doc else node.lineno        # 0-based: the line after
        indent = " " * node.body[-1].col_offset
        if not any(after <= b < node.end_lineno and ind == indent for _, b, _, ind in own):
            raise AssignmentError(f"part {part.name!r}: {part.file} has no region of it in the body of "
                                  f"{name}, after the docstring, at the body's indentation")


def blank(text, path, chosen):
    """The source with each chosen part's regions replaced by a raise and every other marker line removed."""
    lines = text.splitlines(keepends=True)
    out, i = [], 0
    for part, begin, end, indent in regions([l.rstrip("\n") for l in lines], path):
        out += lines[i:begin]
        if part in chosen:
            out.append(f'{indent}raise NotImplementedError("{part}: write this part (see HANDOUT.md)")\n')
        else:
            out += lines[begin + 1:end]
        i = end + 1
    result = "".join(out + lines[i:])
    ast.parse(result, filename=path)            # a region in the wrong place would break the file
    return result


# ----------------------------------------------------------------------------------------
# HANDOUT.md

def signature_and_docstring(node, lines):
    """The source of a function's (or class's) ``def`` line(s) and its docstring, dedented."""
    doc = node.body[0] if ast.get_docstring(node) is not None else None
    stop = doc.end_lineno if doc else node.body[0].lineno - 1
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    block = lines[start - 1:stop]
    while block and (not block[-1].strip() or block[-1].strip().startswith("#")):
        block.pop()                              # the marker comment of a function without docstring
    if not doc:
        block.append(" " * (node.body[0].col_offset) + "...")
    return textwrap.dedent("\n".join(block))


def api(part, root):
    """The signatures and docstrings of a part's functions (a method under its class's docstring)."""
    text = (root / part.file).read_text(encoding="utf-8")
    tree, lines = ast.parse(text), text.splitlines()
    defs = functions(tree)
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    blocks, shown = [], set()
    for name in part.functions:
        cls, _, _ = name.rpartition(".")
        if cls and cls not in shown:
            shown.add(cls)
            blocks.append(signature_and_docstring(classes[cls], lines))
        block = signature_and_docstring(defs[name], lines)
        blocks.append(textwrap.indent(block, "    ") if cls else block)
    return "\n\n".join(blocks)


# How each part file is graded: what its tests import besides it.
GRADED_WITH = {
    "losses.py": "alone: it imports only torch",
    "rewards.py": "alone: it imports only the standard library",
    "train.py": "with `losses.py` and `rewards.py` replaced by stand-ins: `train.py` imports them, "
                "`completion_mask` needs neither",
}


def handout(root, parts):
    total, files = sum(p.points for p in parts), sorted({p.file for p in parts})
    visible = f"{1 - assignment.HIDDEN_SHARE:.0%}"
    has_experiments = (root / EXPERIMENTS).exists()
    if has_experiments:
        try:
            targets.check(root)               # no stale sanity target reaches a student
        except targets.StaleTarget as e:
            raise AssignmentError(str(e)) from None
    count = len(targets.sections((root / EXPERIMENTS).read_text(encoding="utf-8"))) if has_experiments else 0
    code, write_up = assignment.CODE_POINTS, assignment.EXPERIMENT_POINTS
    out = ["# Assignment: GRPO and three token-regulated variants\n",
           f"You write {len(parts)} part{'s' * (len(parts) > 1)} of this repo and run {count} small "
           "experiments. Each part is one function or a few short ones, in the file "
           "named below; until you write them their bodies raise `NotImplementedError(\"<part>: ...\")`. "
           "Keep every signature. The docstrings are the specification (shapes, equations, defaults); "
           "README.md explains the methods and their pitfalls.\n",
           f"**Points: {code + write_up} in all.** The code is {code}: the parts' {total} points below, "
           f"as `python -m course.grade` scores them, scaled to {code}. The experiments are {write_up}: "
           "your write-up, graded by your instructor (each experiment's points are in its heading).\n",
           "## Grading\n",
           "    python -m course.grade           "
           "# every part: visible tests passed / total, points / max, total",
           "    python -m course.grade --part NAME  # one part",
           "    python -m course.grade --json       # the same as one JSON object\n",
           "Each part's visible tests are in `tests/graded/test_<part>.py`: small literal inputs whose "
           "expected values are worked out in the test. Your instructor grades with more: hidden tests "
           "that check each part on random inputs against independent computations, worth "
           f"{assignment.HIDDEN_SHARE:.0%} of its points (the visible tests give the other {visible}). "
           f"Code that only reproduces the visible tests' literals earns at most the visible tests' "
           f"{visible} of a part, and none of the hidden tests' {assignment.HIDDEN_SHARE:.0%}. "
           "A part scores its points times the fraction of its tests that pass, rounded to 0.1. Each "
           "part's tests run in a process of their own, under a time limit; nothing your code prints "
           "counts. The tests of one part never call another part's function, so the parts can be "
           "written in any order. The other tests "
           "(`python -m pytest -q`) check the whole repo and are not graded; some fail until every part is "
           "written. Change your source files, not the tests or `grade.py`: the instructor uses their own. "
           f"The grader's total is the code's {total} points; the {write_up} of the experiments are not "
           "in it.\n",
           "| part | file | write | points |", "|---|---|---|---|"]
    out += [f"| `{p.name}` | `{p.file}` | {', '.join(f'`{f}`' for f in assignment.required(p))}"
            + (f" (optional, not graded: {', '.join(f'`{f}`' for f in p.optional)})" if p.optional else "")
            + f" | {p.points} |" for p in parts]
    out += ["\n## Files, and what each part depends on\n",
            "| file | its parts | its tests load it |", "|---|---|---|"]
    out += [f"| `{f}` | {', '.join(f'`{p.name}`' for p in parts if p.file == f)} | {GRADED_WITH.get(f, '')} |"
            for f in files]
    out += ["\nA syntax error, or an exception while a file is imported, costs the parts of that file and no "
            "other.\n",
            "## What to submit\n",
            f"- Your {', '.join(f'`{f}`' for f in files)}: the file{'s' * (len(files) > 1)} your parts "
            "live in. Nothing else is graded: another file (a helper module, your own tests, a changed "
            "`tests/graded/`) is listed by the grader and neither copied nor used, so keep any helper "
            "inside the part's file.",
            "- A write-up (PDF or Markdown) with the plots and the answers of the experiments below.\n",
            "## Libraries\n",
            "Allowed: Python's standard library and torch (`torch.nn.functional` included). Not allowed: "
            "calling or copying a published implementation of these functions, such as TRL's log-prob and "
            "entropy helpers (`selective_log_softmax`, `entropy_from_logits`) or its GRPO loss, verl's, "
            "OpenRLHF's, or the "
            "repository this assignment comes from. No new dependencies: your files are graded with "
            "`requirements.txt` alone.\n",
            "## Once every part passes\n",
            "`python -m pytest -q` passes, and `make demo-tiny` trains the tiny model, seed 0: held-out "
            "greedy accuracy goes " + demo_tiny(root) + ". Then run the experiments."]
    for n, p in enumerate(parts, 1):
        out += [f"\n## {n}. `{p.name}` ({p.points} points)\n", p.goal + "\n",
                f"In `{p.file}`:\n", "```python", api(p, root), "```\n"]
        for label, value in (("The `info` dict", p.info), ("Errors", p.errors), ("Notes", p.notes)):
            if value:
                out.append(f"**{label}:** {value}\n")
        out.append(f"Graded by `{assignment.graded_tests_of(p)}`: `python -m course.grade --part {p.name}`")
    if has_experiments:
        out.append("\n" + experiments(root, points=True))
    return "\n".join(out) + "\n"


def demo_tiny(root):
    """What `make demo-tiny` gives, from the measurements of docs/performance.md (targets.QUOTED)."""
    try:
        v = targets.values(root)
    except (targets.StaleTarget, OSError):
        return "from about 0 to about 0.4 in 150 steps"
    return (f"{v['demo_acc']} in 150 steps on three CPUs (docs/performance.md: each CPU draws its "
            "own samples, so its own digits), in "
            f"{v['demo_avx512'].split('–')[0]}–{v['demo_avx2'].split('–')[-1]} min on 2 cores")


def experiments(root, source=EXPERIMENTS, points=False):
    """docs/experiments.md as a section of HANDOUT.md: headings one level down, links from the root,
    and (``points``) each experiment's points in its heading (course/answers.py's rubric)."""
    text = (root / source).read_text(encoding="utf-8")
    if points:
        text = re.sub(r"(?m)^## (\d+)\. (.*)$",
                      lambda m: f"## {m[1]}. {m[2]} ({answers.experiment_points(m[1])} points)", text)
        text = re.sub(r"(?m)^# Experiments$", f"# Experiments ({assignment.EXPERIMENT_POINTS} points)", text)
    text = re.sub(r"(?m)^(#+) ", r"#\1 ", text)
    def from_root(m):
        target = m[2]
        if re.match(r"[a-z]+:|#", target):
            return m[0]
        path = os.path.normpath(os.path.join(os.path.dirname(source), target)).replace(os.sep, "/")
        return f"[{m[1]}]({path})"
    return LINK.sub(from_root, text).rstrip()


# ----------------------------------------------------------------------------------------
# The copies

def instructor_only(name):
    """Whether the student's copy leaves out this file (assignment.INSTRUCTOR_ONLY, folders included)."""
    return any(name == x or name.startswith(x.rstrip("/") + "/") for x in assignment.INSTRUCTOR_ONLY)


def empty_destination(path, root):
    path = Path(path).resolve()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise AssignmentError(f"{path} exists and is not empty: give a new or empty directory "
                              "(nothing was written)")
    if path == root or root in path.parents:
        raise AssignmentError(f"{path} is inside the repo: the next copy would copy it too; "
                              "write it elsewhere")
    return path


def unlink_left_out(text, name, left_out):
    """Markdown links to files the student's copy leaves out become plain text, marked as such."""
    def replace(m):
        target = m[2].split("#")[0]
        if not target or re.match(r"[a-z]+:", target):
            return m[0]
        path = os.path.normpath(os.path.join(os.path.dirname(name), target)).replace(os.sep, "/")
        return f"{m[1]} (instructor's copy only)" if left_out(path) else m[0]
    return LINK.sub(replace, text)


# The student's README: what replaces the instructor's reading order and kit row, and the
# visible test that guards a pitfall whose cited test the copy leaves out.
STUDENT_NOTE = """> **This is your copy of the assignment.** [HANDOUT.md](HANDOUT.md) says which functions you
> write, how they are graded, what to hand in, and the experiments to run. Until your parts
> are written they raise `NotImplementedError`, and so do the commands and the ungraded tests
> that use them (`make demo`, `python losses.py`); `python -m course.grade` works from the start.
"""
STUDENT_READING_ORDER = """## Reading order

1. [HANDOUT.md](HANDOUT.md): the parts you write, the file each lives in, how they are graded,
   what to submit, and the experiments.
2. [`losses.py`](losses.py) top to bottom: the shared pieces (advantages, surrogate, KL,
   aggregation), then `grpo_loss`, then each variant, a few lines away from it. The bodies you
   write raise `NotImplementedError`; their docstrings are the specification.
3. [`tests/graded/`](tests/graded): each part's examples, worked out by hand
   (`python -m course.grade --part NAME` runs one part's).
4. [`train.py`](train.py), top to bottom, with `grpo_step` as the heart of it. Once your parts
   pass, step through two steps of it with `python -m pdb train.py --preset tiny --plain --steps 2`:
   `--plain` samples with transformers' `generate()` and scores with the plain `score()`.
5. [`rewards.py`](rewards.py) and [`data.py`](data.py): what the model is rewarded for.
6. Only then the machinery: [`engine/`](engine), with [docs/performance.md](docs/performance.md)
   beside it.

"""
STUDENT_KIT_ROW = ("| [`course/`](course), [`HANDOUT.md`](HANDOUT.md) | your assignment: what to write and "
                   "hand in, and the grader that scores your parts (`python -m course.grade`) |")
STUDENT_TESTS = {
    "test_group_advantages_zero_std_is_exactly_zero": "test_a_group_with_equal_rewards_gets_exactly_zero",
    "test_micro_batches_accumulate_to_the_full_batch_gradient":
        "test_scaled_micro_batches_add_up_to_the_full_batch",
    "test_temperature_matters_and_entropy_is_of_the_full_distribution":
        "test_logprob_of_the_token_and_entropy_of_the_whole_distribution",
    "test_on_policy_ratio_is_one_loss_is_weighted_advantage":
        "test_ratio_is_one_before_the_first_update_and_warns_otherwise",
}


def student_readme(text, defined, left_out):
    """The README as the student's copy has it: a note on top, the student's reading order,
    no "For instructors", the kit row about the student's side of it, pitfalls citing only tests
    that are in the copy (``defined``), and no bullet pointing at a file it leaves out."""
    title, _, rest = text.partition("\n\n")
    sections = re.split(r"(?m)^(?=## )", rest)
    kept = []
    for section in sections:
        heading = section.split("\n", 1)[0]
        if heading == "## For instructors":
            continue
        kept.append(STUDENT_READING_ORDER if heading == "## Reading order" else section)
    if len(kept) != len(sections) - 1 or STUDENT_READING_ORDER not in kept:
        raise AssignmentError("README.md: no '## Reading order' or '## For instructors' section to rewrite "
                              "for the student's copy (make_assignment.student_readme)")
    out = title + "\n\n" + STUDENT_NOTE + "\n" + "".join(kept)
    rows = [line for line in out.splitlines() if line.startswith("| [`course/`]")]
    if len(rows) != 1:
        raise AssignmentError("README.md: no table row starting with [`course/`] to replace "
                              "for the student's copy (make_assignment.STUDENT_KIT_ROW)")
    out = out.replace(rows[0], STUDENT_KIT_ROW)

    def cite(m):
        name = STUDENT_TESTS.get(m[1], m[1])
        return m[0].replace(m[1], name) if name in defined else ""    # a citation it cannot keep goes
    out = re.sub(r"\s+\(`(test_\w+)`\)", cite, out)              # "... (`test_x`)."
    out = re.sub(r"; `(test_\w+)`(?=\))", cite, out)               # "(`a formula`; `test_x`)"
    out = LINK.sub(lambda m: m[1] if m[2] == "#for-instructors" else m[0], out)
    bullet = re.compile(r"^- \[[^\]]*\]\(([^)#]+)[^)]*\)")
    return "".join(line for line in out.splitlines(keepends=True)
                   if not ((m := bullet.match(line))
                           and left_out(os.path.normpath(m[1]).replace(os.sep, "/"))))


def assigned_line(chosen):
    return "ASSIGNED = None" if len(chosen) == len(assignment.PARTS) else f"ASSIGNED = {tuple(chosen)!r}"


def write_copy(root, dest, files, transform):
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        new = transform(name)
        if new is None:
            shutil.copy2(root / name, target)
        else:
            target.write_text(new, encoding="utf-8")
            shutil.copymode(root / name, target)


def with_assigned(text, chosen):
    if text.count("\nASSIGNED = None\n") != 1:
        raise AssignmentError("course/assignment.py must hold exactly one line 'ASSIGNED = None'")
    return text.replace("\nASSIGNED = None\n", f"\n{assigned_line(chosen)}\n")


def make(out, part_names=None, answer_key=None, root=ROOT):
    """Write the student's copy into ``out`` (and the answer key); returns the chosen part names."""
    root = Path(root).resolve()
    names = part_names or [p.name for p in assignment.PARTS]
    chosen = [assignment.part(n).name for n in names]           # ValueError for an unknown name
    chosen = [p.name for p in assignment.PARTS if p.name in chosen]  # registry order, no repeats
    out = empty_destination(out, root)
    key = empty_destination(answer_key, root) if answer_key else None
    if key == out:
        raise AssignmentError("--out and --answer-key must be different directories")
    if key and (key in out.parents or out in key.parents):
        inner, outer = (key, "--out") if out in key.parents else (out, "--answer-key")
        raise AssignmentError(f"{inner} is inside {outer}: give --out and --answer-key two directories "
                              "side by side (an answer key inside the student's copy would be handed out "
                              "with it; nothing was written)")
    for name in chosen:
        check_part(assignment.part(name), root)
    files = repo_files(root)
    copied = [n for n in files if not instructor_only(n)]
    marked = {p.file for p in assignment.PARTS}          # every part's file loses its marker lines
    defined = {name for n in copied if n.startswith("tests/") and n.endswith(".py")
               for name in re.findall(r"(?m)^\s*def (test_\w+)", (root / n).read_text(encoding="utf-8"))}

    def student(name):
        text = lambda: (root / name).read_text(encoding="utf-8")
        if name == "course/assignment.py":
            return with_assigned(text(), chosen)
        if name in marked:
            return blank(text(), name, set(chosen))
        if name == "README.md":
            return unlink_left_out(student_readme(text(), defined, instructor_only), name, instructor_only)
        if name.endswith(".md"):
            return unlink_left_out(text(), name, instructor_only)
        return None

    # Everything is computed before anything is written, so an error leaves no half copy.
    texts = {n: student(n) for n in copied}
    guide = handout(root, [assignment.part(n) for n in chosen])
    model_answers = answers.answers_md(root) if key and (root / EXPERIMENTS).exists() else ""
    out.mkdir(parents=True, exist_ok=True)
    write_copy(root, out, copied, texts.get)
    (out / "HANDOUT.md").write_text(guide, encoding="utf-8")
    if key:
        key.mkdir(parents=True, exist_ok=True)
        assigned = with_assigned((root / "course/assignment.py").read_text(encoding="utf-8"), chosen)
        write_copy(root, key, files, lambda n: assigned if n == "course/assignment.py" else None)
        (key / "HANDOUT.md").write_text(guide, encoding="utf-8")
        (key / "ANSWERS.md").write_text(model_answers, encoding="utf-8")
    return chosen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the student's copy: a new or empty directory")
    parser.add_argument("--parts", nargs="+", metavar="NAME",
                        help="the parts to blank (default: all): "
                             f"{', '.join(p.name for p in assignment.PARTS)}")
    parser.add_argument("--answer-key", metavar="DIR", help="also write the instructor's copy here")
    args = parser.parse_args(argv)
    try:
        chosen = make(args.out, args.parts, args.answer_key)
    except (AssignmentError, ValueError) as e:
        parser.exit(2, f"course/make_assignment.py: error: {e}\n")
    points = sum(assignment.part(n).points for n in chosen)
    print(f"student copy: {args.out}  ({len(chosen)} parts, {points} points; see its HANDOUT.md)")
    if args.answer_key:
        print(f"answer key:   {args.answer_key}  (solutions and hidden tests: keep it private)")


if __name__ == "__main__":
    main()
