"""The repo reads as a textbook, and stays that way: the README is short and points at files
that exist, train.py is the algorithm (no speed device defined in it), and the specification
ships inside the repo."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(path):
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            yield target.split("#")[0]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    missing = [t for t in relative_links(doc) if t and not (doc.parent / t).exists()]
    assert not missing, f"{doc.name} links to files that do not exist: {missing}"


def test_the_readme_teaches_and_keeps_no_history():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 22_000
    assert "fresh clone" not in text
    # A commit hash: 7-40 hex digits with at least one letter and one digit, as a word of its own.
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not hashes, hashes


def test_the_specification_ships_with_the_repo():
    assert (REPO / "docs" / "METHODS.md").exists()
    old = "../shared/" + "METHODS.md"             # the path outside the repo that no clone has
    files = [p for p in REPO.rglob("*") if p.suffix in {".py", ".md"} and not {".git", "runs"} & set(p.parts)]
    stale = [str(p.relative_to(REPO)) for p in files if old in p.read_text(encoding="utf-8")]
    assert not stale, stale


def test_train_py_is_the_algorithm():
    source = (REPO / "train.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 450
    functions = {f.name: f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)}
    step = functions["grpo_step"]
    assert step.end_lineno - step.lineno + 1 <= 70
    devices = {"sample", "draw", "prefill", "keep_rows", "weight_first_linears", "score_sharing_prompts",
               "matmul_peak", "step_flops", "forward_flops_per_token"}
    assert not devices & set(functions), devices & set(functions)
