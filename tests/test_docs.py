"""The repo reads as a textbook, and stays that way: the README is short and points at files
and headings that exist, train.py is the algorithm (no speed device defined in it), the specification
ships inside the repo, and no line is longer than pyproject.toml's limit."""
import ast
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FOLDERS = ["engine", "experiments", "experiments/benchmarks", "course", "multigpu"]   # the non-learner code
CODE = sorted(REPO.glob("*.py")) + [p for f in FOLDERS for p in sorted((REPO / f).glob("*.py"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(path):
    """Each link that is not a URL, as (file, anchor): `file`, `file#anchor` or `#anchor`."""
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+:", target):
            file, _, anchor = target.partition("#")
            yield file, anchor


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    missing = [f for f, _ in relative_links(doc) if f and not (doc.parent / f).exists()]
    assert not missing, f"{doc.name} links to files that do not exist: {missing}"


@functools.cache              # each page once, not once for every link to it
def headings(path):
    """The anchors GitHub makes of a Markdown file's headings: lower case, punctuation dropped,
    spaces to hyphens, a repeated heading numbered -1, -2, ...; none from inside code blocks."""
    anchors, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).strip().lower()
            anchor = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
            anchors.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
            seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def test_headings_make_githubs_anchors():
    page = REPO / "docs" / "performance.md"
    assert "cuda-graphs-sample_in_place-and-cuda_graph" in headings(page)
    assert "a-step-on-a-24-gb-gpu-arithmetic" in headings(page)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_to_a_heading_finds_it(doc):
    """A renamed heading breaks the links to it silently: `file.md#anchor` and `#anchor` must
    name a heading there."""
    broken = []
    for file, anchor in relative_links(doc):
        page = (doc.parent / file) if file else doc
        if anchor and page.suffix == ".md" and page.exists() and anchor not in headings(page):
            broken.append(f"{file}#{anchor}")
    assert not broken, f"{doc.name} links to headings that do not exist: {broken}"


def test_the_readme_teaches_and_keeps_no_history():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 16_000     # detail lives in docs/: the results in short, the rest linked
    assert "fresh clone" not in text
    # A commit hash: 7-40 hex digits with at least one letter and one digit, as a word of its own.
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text)
              if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not hashes, hashes


TABLE = re.compile(r"(?m)(?:^\|.*\n)+")      # a Markdown table: consecutive lines starting with |


def written_by_make_figures():
    """The text of each docs/figures/**/results.md, the tables `make figures` writes."""
    paths = sorted((REPO / "docs" / "figures").rglob("results.md"))
    return [path.read_text(encoding="utf-8") for path in paths]


def test_every_result_table_is_one_make_figures_writes():
    """A result table (a header that begins `| loss`) in the README or docs/results.md is, header to
    last row, one that `make figures` wrote into docs/figures/**/results.md, and
    tests/test_plots.py keeps those equal to what plots.py draws from logs/ now. So no result
    table is typed by hand, and none is left behind when the logs change."""
    written = {table for text in written_by_make_figures() for table in TABLE.findall(text)}
    assert written, "no docs/figures/**/results.md: run make figures"
    for doc in [REPO / "README.md", REPO / "docs" / "results.md"]:
        tables = [t for t in TABLE.findall(doc.read_text(encoding="utf-8"))
                  if t.startswith(("| loss", "| arm"))]
        assert tables or doc.name == "README.md", doc.name
        stray = [t.splitlines()[0] for t in tables
                 if t not in written]
        assert not stray, (f"{doc.name}: tables that make figures did not write (run it, or paste "
                           "its own):\n" + "\n".join(stray))


# A number quoted with its interval in prose: "−0.305 (−0.52 to −0.09)", "0.188 (0.140 to 0.236)",
# "0.620 (0.54–0.70)", and the permutation p where one follows.
QUOTED = re.compile(r"[+−]?\d+\.\d+ \([+−]?\d+\.\d+(?: to |–)[+−]?[\d.]+(?:e[−+]\d+)?\)"
                    r"(?:, p = \d\.\d+)?")


def test_every_interval_quoted_in_prose_is_one_make_figures_writes():
    """A number and its interval quoted in the sentences of the README or docs/results.md are, to
    the digit, a cell that `make figures` wrote into docs/figures/**/results.md. So a sentence
    cannot keep a number the logs no longer give (as runs come in, the tables change under it),
    and a range of seeds is not written as if it were an interval (say "its seeds 0.2 to 0.4")."""
    written = "".join(written_by_make_figures())
    stray = []
    for doc in [REPO / "README.md", REPO / "docs" / "results.md"]:
        lines = [line for line in doc.read_text(encoding="utf-8").splitlines() if not line.startswith("|")]
        prose = re.sub(r"\s+", " ", " ".join(lines))           # a quote may break across two lines
        stray += [f"{doc.name}: {quote}" for quote in QUOTED.findall(prose) if quote not in written]
    assert not stray, "quoted in prose, written by no table (run make figures, or quote its cell):\n" + \
        "\n".join(stray)


# The repo speaks of its own work: no word of the machines it was once measured on and their terms.
REMOTE = re.compile(r"\b(leases?|leased|lent|device (calls?|time|tool)|gpu_session|sessions?)\b", re.I)


@pytest.mark.parametrize("path", [*DOCS, REPO / "logs" / "README.md", REPO / "Makefile", REPO / ".ci" / "run",
                                  *CODE],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_the_repo_speaks_of_its_own_work_alone(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    hits = [f"{number}: {line.strip()}" for number, line in enumerate(lines, 1) if REMOTE.search(line)]
    assert not hits, f"{path.name} speaks of a particular machine's terms:\n" + "\n".join(hits)


def test_the_log_is_one_dated_entry_per_finding_newest_first():
    """docs/LOG.md: each entry a `## YYYY-MM-DD: the finding` heading, the newest first."""
    entries = re.findall(r"(?m)^## (.*)$", (REPO / "docs" / "LOG.md").read_text(encoding="utf-8"))
    assert entries
    undated = [e for e in entries if not re.match(r"\d{4}-\d{2}-\d{2}: \S", e)]
    assert not undated, undated
    dates = [e[:10] for e in entries]
    assert dates == sorted(dates, reverse=True), "LOG.md: the newest entry first"


def test_the_specification_ships_with_the_repo():
    assert (REPO / "docs" / "METHODS.md").exists()
    old = "../shared/" + "METHODS.md"             # the path outside the repo that no clone has
    files = [p for p in REPO.rglob("*") if p.suffix in {".py", ".md"} and not {".git", "runs"} & set(p.parts)]
    stale = [str(p.relative_to(REPO)) for p in files if old in p.read_text(encoding="utf-8")]
    assert not stale, stale


def test_train_py_is_the_algorithm():
    source = (REPO / "train.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 505      # 460 + the other readings' flags and pass@k
    functions = {f.name: f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)}
    step = functions["grpo_step"]
    assert step.end_lineno - step.lineno + 1 <= 70
    devices = {"sample", "draw", "prefill", "keep_rows", "weight_first_linears", "score_sharing_prompts",
               "matmul_peak", "step_flops", "forward_flops_per_token"}
    assert not devices & set(functions), devices & set(functions)


def configured_line_length():
    """[tool.ruff] line-length in pyproject.toml, read without ruff (CI's environment has none)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib                                  # Python >= 3.11
    except ModuleNotFoundError:
        match = re.search(r"^\[tool\.ruff\]\s*$[^[]*?^line-length\s*=\s*(\d+)", text, re.M)
        assert match, "pyproject.toml has no line-length under [tool.ruff]"
        return int(match.group(1))
    return tomllib.loads(text)["tool"]["ruff"]["line-length"]


def test_no_line_is_longer_than_the_configured_limit():
    limit = configured_line_length()
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    try:
        listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("git is not installed: no list of tracked files")
    if listed.returncode != 0:
        pytest.skip(f"git ls-files failed: {listed.stderr.strip()}")
    files = listed.stdout.splitlines()
    assert files, "git ls-files listed no Python file"
    too_long = [f"{name}:{number} ({len(line)} columns)"
                for name in files if (REPO / name).exists()
                for number, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1)
                if len(line) > limit]
    assert not too_long, f"lines longer than {limit} columns (pyproject.toml):\n" + "\n".join(too_long)


def test_our_code_calls_no_deprecated_transformers_api():
    """pytest.ini ignores two FutureWarnings that peft and TRL raise through their own calls;
    this keeps the deprecated names out of ours (transformers 5.24: `cache=`, activation
    checkpointing)."""
    deprecated = re.compile(r"past_key_values\s*=|\.past_key_values\b|gradient_checkpointing_(en|dis)able|"
                            r"is_gradient_checkpointing")
    offenders = [f"{path.relative_to(REPO)}:{number}" for path in CODE
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if deprecated.search(line)]
    assert not offenders, offenders


# Every command the docs give, as a reader would copy it: `python X.py ...` or `python -m a.b ...`.
COMMAND = re.compile(r"python3? (?:-m pdb )?(?:-m ([\w.]+)|([\w/]+\.py))")


def documented_commands():
    """{script or module: [where it is written]} from the README, docs/ and logs/README.md."""
    found = {}
    for doc in [*DOCS, REPO / "logs" / "README.md"]:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for module, script in COMMAND.findall(line):
                name = module or script
                if module in ("pytest", "pip", "venv", "pdb", "http.server"):
                    continue
                found.setdefault(name, []).append(f"{doc.relative_to(REPO)}:{number}")
    return found


def test_every_documented_command_names_a_file_of_the_repo():
    """A command moved with its file (`python compare.py` became `python -m experiments.compare`):
    every script or module the docs run exists where the command says, from the repo root."""
    def path(name):
        return REPO / name if name.endswith(".py") else REPO / (name.replace(".", "/") + ".py")
    missing = [f"{name} ({', '.join(where[:3])})" for name, where in documented_commands().items()
               if not path(name).exists()]
    assert not missing, "the docs run files that do not exist:\n" + "\n".join(missing)


def test_a_file_of_the_repo_is_named_where_it_is():
    """A path in backticks whose file is one of the repo's names the place it is in now
    (`benchmarks/tepo_clip.py` after it moved to experiments/benchmarks/). A path whose file the
    repo does not have (another project's, one a command writes) is not checked."""
    ours = {}
    for p in REPO.rglob("*.py"):
        if not {".venv", "runs", ".git"} & set(p.relative_to(REPO).parts):
            ours.setdefault(p.name, []).append(p.relative_to(REPO).as_posix())
    wrong = []
    for doc in DOCS + sorted(REPO.glob("*/README.md")) + sorted((REPO / "course").glob("*.md")):
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for named in re.findall(r"`([\w./-]+/[\w.-]+\.py)`", line):
                name = named.rsplit("/", 1)[1]
                if name in ours and name != "__init__.py" and not named.startswith("../") \
                        and not (REPO / named).exists():
                    wrong.append(f"{doc.relative_to(REPO)}:{number}: {named} (it is at {ours[name]})")
    assert not wrong, "the docs name files where they are not:\n" + "\n".join(wrong)


@pytest.mark.slow
def test_every_documented_command_answers_help():
    """Each of them starts from the root and prints its usage: the imports it needs resolve there."""
    env = {**os.environ, "PYTHONPATH": ""}
    for name in sorted(documented_commands()):
        command = [sys.executable, name] if name.endswith(".py") else [sys.executable, "-m", name]
        run = subprocess.run(command + ["--help"], cwd=REPO, capture_output=True, text=True, timeout=300,
                             env=env)
        assert run.returncode == 0 and "usage" in run.stdout.lower(), f"{name}:\n{run.stderr[-2000:]}"
