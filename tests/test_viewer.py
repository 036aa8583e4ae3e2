"""Tests for the token viewer (`python plots.py RUN_DIR --html`): its numbers are token_weights()'s,
model text stays text, the shipped pages are what `make figures` writes, and a real browser runs it."""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import plots
from experiments import viewer
from losses import LOSSES

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "</script><img src=x onerror=alert(1)>"
TOKENS = [["7", " +", " 5", " =", " 1", "2", "\n", "####", " ", "1", "2", "<|im_end|>", "<|im_end|>"],
          [HOSTILE, "<b>", "bold", "</b>", " &amp;", " <!--", "\t", "", "\r\n", "<|im_end|>", "", "", ""],
          ["1", "0", "\n", "####", " ", "1", "0", "<|im_end|>", "<|im_end|>", "", "", "", ""]]
MASK = [[1] * 12 + [0], [1] * 10 + [0] * 3, [1] * 8 + [0] * 5]
g = torch.Generator().manual_seed(1)
SAMPLE = {"step": 3, "prompt": "Q: 7 + 5 < 13 & </script><script>alert(2)</script>\nA: ",
          "completions": ["a", "b", "c"], "tokens": TOKENS, "mask": MASK,
          "logp": torch.log(torch.rand(3, 13, generator=g) * 0.98 + 0.01).tolist(),
          "entropy": (torch.rand(3, 13, generator=g) * 2).tolist(),
          "advantages": [1.15, -0.6, -0.55], "rewards": [1.1, 0.0, 0.1]}


def make_run(root, name="tepo-s0", samples=(SAMPLE,), **config):
    """A run directory with a config, a few metrics and `samples` as samples.jsonl."""
    run = root / name
    run.mkdir(parents=True)
    config = {"loss": "tepo", "seed": 0, "beta": 0.04, "group_size": 3} | config
    (run / "config.json").write_text(json.dumps(config))
    lines = [{"step": 0, "eval_accuracy": 0.2}] + [
        {"step": s, "loss": 0.1, "reward": 0.1 * s, "entropy": 1 - 0.1 * s} for s in (1, 2, 3)] + [
        {"step": 3, "eval_accuracy": 0.4}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return run


def page_data(text):
    """The JSON the page embeds, parsed back."""
    blocks = re.findall(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


def write_page(tmp_path, **kw):
    run = make_run(tmp_path, **kw)
    assert plots.main([str(run), "--out", str(tmp_path / "out"), "--html"]) == 0
    return tmp_path / "out" / "pages" / f"{run.name}.html"


def losses_own(name, **control):
    """LOSSES[name]'s own info (weights, TEPO's KL mask) on SAMPLE in float64, as the viewer calls it."""
    t = {k: torch.tensor(SAMPLE[k], dtype=torch.float64) for k in ("logp", "mask", "entropy", "advantages")}
    return LOSSES[name](t["logp"], t["logp"], None, t["advantages"], t["mask"], t["entropy"], beta=0.0,
                        **control)[1]


def test_the_page_holds_token_weights_numbers(tmp_path):
    """Every number the page colours a token by is token_weights()'s for that token (float64,
    rounded to 4 significant digits; within that rounding of the float32 figure's), and the KL mask
    is exactly the figure's; the padding after the first EOS is left out."""
    page = write_page(tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == ["tepo-s0.html"]  # no PNG
    group = page_data(page.read_text(encoding="utf-8"))["groups"][0]
    exact, figure = plots.token_weights(SAMPLE, dtype=torch.float64), plots.token_weights(SAMPLE)
    for name in LOSSES:                           # token_weights() is the losses' own weights
        info = losses_own(name)
        assert torch.equal(exact[name][0], info["weights"])
    assert torch.equal(exact["tepo"][1], info["kl_mask"])
    assert group["step"] == 3 and group["prompt"] == SAMPLE["prompt"]
    for i, row in enumerate(group["rows"]):
        n = sum(MASK[i])
        assert row["tokens"] == TOKENS[i][:n]
        assert row["reward"] == viewer.rounded(SAMPLE["rewards"][i])
        assert row["adv"] == viewer.rounded(SAMPLE["advantages"][i])
        assert row["logp"] == [viewer.rounded(x) for x in SAMPLE["logp"][i][:n]]
        assert row["entropy"] == [viewer.rounded(x) for x in SAMPLE["entropy"][i][:n]]
        for name in LOSSES:
            assert row["w"][name] == [viewer.rounded(x) for x in exact[name][0][i, :n].tolist()]
            assert row["w"][name] == pytest.approx(figure[name][0][i, :n].tolist(), rel=6e-4, abs=1e-30)
        assert row["kl"] == exact["tepo"][1][i, :n].tolist() == figure["tepo"][1][i, :n].tolist()
    assert any(group["rows"][0]["kl"]) and not any(group["rows"][1]["kl"])     # A > 0 only
    assert len(set(group["rows"][0]["w"]["tr_grpo"])) > 1                      # something to see


def test_a_control_runs_page_shows_its_own_tr_grpo_weights(tmp_path):
    """A page of a --tr-mean-one run colours TR-GRPO's tokens by the weights that run trained with
    (mean 1 over each answer's tokens, some below 1) and says so; the default run's page keeps the
    paper's weights (never below 1); the other losses' weights are the same on both pages."""
    default = page_data(write_page(tmp_path / "a", name="tr_grpo-s0", loss="tr_grpo")
                        .read_text(encoding="utf-8"))
    control = page_data(write_page(tmp_path / "b", name="tr_grpo-mean1-s0", loss="tr_grpo",
                                   tr_mean_one=True).read_text(encoding="utf-8"))
    exact = plots.token_weights(SAMPLE, dtype=torch.float64, tr_mean_one=True)
    assert torch.equal(exact["tr_grpo"][0], losses_own("tr_grpo", mean_one=True)["weights"])
    for i, (d, c) in enumerate(zip(default["groups"][0]["rows"], control["groups"][0]["rows"])):
        n = sum(MASK[i])
        assert c["w"]["tr_grpo"] == [viewer.rounded(x) for x in exact["tr_grpo"][0][i, :n].tolist()]
        assert sum(c["w"]["tr_grpo"]) / n == pytest.approx(1.0, abs=1e-3)
        assert min(d["w"]["tr_grpo"]) >= 1.0 and c["w"]["tr_grpo"] != d["w"]["tr_grpo"]
        assert {k: v for k, v in c["w"].items() if k != "tr_grpo"} == {k: v for k, v in d["w"].items()
                                                                      if k != "tr_grpo"}
    assert min(min(row["w"]["tr_grpo"]) for row in control["groups"][0]["rows"]) < 1.0
    label = {m["key"]: m["label"] for m in control["modes"]}["tr_grpo"]
    assert label == "TR-GRPO weight (mean 1)"
    assert {m["key"]: m["label"] for m in default["modes"]}["tr_grpo"] == "TR-GRPO weight"


def test_the_same_logs_give_the_same_bytes(tmp_path):
    first = write_page(tmp_path / "a").read_bytes()
    assert write_page(tmp_path / "b").read_bytes() == first
    assert viewer.rounded(float("nan")) is None and viewer.rounded(0.123456) == 0.1235
    assert viewer.rounded(1.0) == 1 and isinstance(viewer.rounded(1.0), int)


def test_model_text_stays_text(tmp_path):
    """Tokens and a prompt holding </script>, <img onerror>, <b>, & and <!--, and a run directory
    named with markup: the raw page has no such tag, and the JSON gives the text back unchanged."""
    page = write_page(tmp_path, name="tepo-<i>x&y<i>-s0")
    text = page.read_text(encoding="utf-8")
    assert text.count("</script>") == 2                      # the data block's and the script's own
    assert text.count("<script") == 2
    for live in ("<img", "<b>", "</b>", "<!--", "<i>", "onerror=alert(1)>"):
        assert live not in text, live
    data = page_data(text)
    assert data["groups"][0]["rows"][1]["tokens"] == TOKENS[1][:10]
    assert data["groups"][0]["prompt"] == SAMPLE["prompt"]
    assert "tepo-&lt;i&gt;x&amp;y&lt;i&gt;-s0" in text       # the run's name, escaped


def test_two_runs_of_one_name_get_two_pages(tmp_path):
    runs = [make_run(tmp_path / "setting-a"), make_run(tmp_path / "setting-b")]
    assert plots.main([str(r) for r in runs] + ["--out", str(tmp_path / "out"), "--html"]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "pages").iterdir()) == [
        "setting-a-tepo-s0.html", "setting-b-tepo-s0.html"]


def html_commands():
    """The Makefile's `plots.py ... --html` lines of `figures`, as argument lists, globs expanded."""
    text = (REPO / "Makefile").read_text()
    recipe = text.split("\nfigures:", 1)[1].split("\n\n", 1)[0]
    commands = []
    for line in recipe.splitlines():
        if "plots.py" in line and "--html" in line:
            args = shlex.split(line.split("plots.py", 1)[1])
            expanded = []
            for a in args:
                expanded += sorted(glob.glob(str(REPO / a))) if "*" in a else [a]
            commands.append(expanded)
    return commands


def test_the_shipped_pages_are_what_make_figures_writes(tmp_path):
    """`make figures` writes a page per loss for seed 0 of each shipped setting into pages/ under
    its figures; the pages in docs/figures are those, byte for byte, and no others."""
    commands = html_commands()
    assert len(commands) == 3, commands
    shipped = {p.relative_to(REPO) for p in (REPO / "docs" / "figures").rglob("pages/*.html")}
    written = set()
    for args in commands:
        out = Path(args[args.index("--out") + 1])
        runs = [a for a in args if a.endswith("-s0/") or a.endswith("-s0")]
        assert {Path(r).name for r in runs} == {f"{loss}-s0" for loss in LOSSES}, args
        fresh = tmp_path / out
        assert plots.main(runs + ["--out", str(fresh), "--html"]) == 0
        for page in sorted((fresh / "pages").iterdir()):
            name = out / "pages" / page.name
            written.add(name)
            assert (REPO / name).exists(), f"{name}: not shipped (run make figures)"
            assert (REPO / name).read_bytes() == page.read_bytes(), f"{name} != what make figures writes"
    assert shipped == written


# ----------------------------------------------------------------------------------------
# In a real browser: Debian's chromium, headless

def chromium():
    """The headless browser, or a skip that says how to get one."""
    for name in [os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"]:
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no chromium on PATH: the page's browser test needs one (.ci/run installs Debian's "
                "with apt-get where it can: apt-get install chromium; or set CHROMIUM=/path/to/it)")


def dump_dom(page, tmp_path, fragment=""):
    """The page's DOM after its script ran, and the browser's console log."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom",
               page.resolve().as_uri() + fragment]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    return done.stdout, console


def assert_ran(dom, console, tokens):
    """The script ran to the end without an error, and drew one element per token."""
    assert 'id="script-error"' not in dom, dom.split('id="script-error"')[1][:500]
    assert not [line for line in console if "rror" in line or "Uncaught" in line], console
    assert len(re.findall(r'<span class="tok[ "]', dom)) == tokens


def test_the_page_runs_in_a_browser_and_shows_text_as_text(tmp_path):
    page = write_page(tmp_path)
    dom, console = dump_dom(page, tmp_path)
    assert_ran(dom, console, sum(MASK[0]) + sum(MASK[1]) + sum(MASK[2]))
    assert "<img" not in dom and "<b>" not in dom and "<!--" not in dom       # no element made of text
    assert "&lt;/script&gt;&lt;img" in dom and "&lt;b&gt;" in dom              # shown as text
    assert 'data-step="3"' in dom


def test_a_shipped_page_runs_in_a_browser(tmp_path):
    """The long TEPO page, as a learner opens it (the first stored group) and at its last step
    coloured by the KL mask: one element per token of the group shown, no script error."""
    page = REPO / "docs" / "figures" / "long" / "pages" / "tepo-s0.html"
    groups = page_data(page.read_text(encoding="utf-8"))["groups"]
    size = lambda group: sum(len(row["tokens"]) for row in group["rows"])
    dom, console = dump_dom(page, tmp_path)
    assert_ran(dom, console, size(groups[0]))
    assert f'data-step="{groups[0]["step"]}"' in dom
    dom, console = dump_dom(page, tmp_path, f"#step={groups[-1]['step']}&colour=kl")
    assert_ran(dom, console, size(groups[-1]))
    assert f'data-step="{groups[-1]["step"]}"' in dom and '<button data-mode="kl" class="on">' in dom


# ----------------------------------------------------------------------------------------
# Hostile logs: every field of samples.jsonl, metrics.jsonl and config.json is typed or escaped

IMG = '"><img src=x onerror="document.title=1">'           # closes an attribute, then a live element


def with_group(**fields):
    """SAMPLE with some fields replaced (a field set to ... is left out)."""
    return {k: v for k, v in (SAMPLE | fields).items() if v is not ...}


def set_in(value, path, new):
    """A copy of the nested lists/dicts `value` with the item at `path` (indexes) replaced."""
    value = json.loads(json.dumps(value))
    inner = value
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = new
    return value


def html_error(tmp_path, run):
    """The error `plots.py RUN --html` stops with (nothing written), as its one line."""
    with pytest.raises(SystemExit) as stop:
        plots.main([str(run), "--out", str(tmp_path / "out"), "--html"])
    assert not (tmp_path / "out" / "pages").exists()
    return str(stop.value.code)


def test_a_string_step_with_no_metrics_is_an_error_not_markup(tmp_path):
    """The probe's case: a string step in samples.jsonl and an empty metrics.jsonl reached an SVG
    attribute unescaped (the <img> ran). A step is a whole number, or the file and line are named."""
    run = make_run(tmp_path, samples=[SAMPLE, with_group(step=IMG)])
    (run / "metrics.jsonl").write_text("")
    message = html_error(tmp_path, run)
    assert "samples.jsonl, line 2: 'step' is" in message and "not a whole number" in message


@pytest.mark.parametrize("step", ["4", 2.5, True, None, -1, 2 ** 60, [4]])
def test_mixed_or_odd_steps_are_an_error_naming_the_line(tmp_path, step):
    run = make_run(tmp_path, samples=[SAMPLE, SAMPLE, with_group(step=step)])
    assert "samples.jsonl, line 3: 'step' is" in html_error(tmp_path, run)


HOSTILE_GROUPS = [   # (what, the group's fields replaced, the words the error must hold)
    ("prompt not text", dict(prompt=["<b>"]), "'prompt'"),
    ("no prompt", dict(prompt=...), "'prompt'"),
    ("tokens not lists", dict(tokens=IMG), "'tokens'"),
    ("a token not text", dict(tokens=set_in(TOKENS, [1, 2], {"x": IMG})), "'tokens'"),
    ("a token a number", dict(tokens=set_in(TOKENS, [0, 0], 7)), "'tokens'"),
    ("no answers", dict(tokens=[], mask=[], logp=[], entropy=[], advantages=[], rewards=[]), "'tokens'"),
    ("a mask value text", dict(mask=set_in(MASK, [0, 3], IMG)), "'mask'"),
    ("a mask value 2", dict(mask=set_in(MASK, [0, 3], 2)), "'mask'"),
    ("a mask row short", dict(mask=set_in(MASK, [1], MASK[1][:-1])), "'mask'"),
    ("a log-prob text", dict(logp=set_in(SAMPLE["logp"], [2, 4], IMG)), "'logp'"),
    ("a log-prob a bool", dict(logp=set_in(SAMPLE["logp"], [2, 4], True)), "'logp'"),
    ("a log-prob huge", dict(logp=set_in(SAMPLE["logp"], [2, 4], 10 ** 400)), "'logp'"),
    ("log-probs of 2 answers", dict(logp=SAMPLE["logp"][:2]), "'logp'"),
    ("an entropy text", dict(entropy=set_in(SAMPLE["entropy"], [0, 0], "1")), "'entropy'"),
    ("entropies a dict", dict(entropy={"a": 1}), "'entropy'"),
    ("an advantage text", dict(advantages=[1.15, IMG, -0.55]), "'advantages'"),
    ("an advantage null", dict(advantages=[1.15, None, -0.55]), "'advantages'"),
    ("rewards too many", dict(rewards=[1, 0, 0, 1]), "'rewards'"),
    ("a reward text", dict(rewards=[1, 0, "<script>"]), "'rewards'"),
    ("no rewards", dict(rewards=...), "'rewards'"),
    ("no step", dict(step=...), "'step'"),
    ("not an object", None, "not a JSON object"),
]


@pytest.mark.parametrize("what,fields,words", HOSTILE_GROUPS, ids=[h[0] for h in HOSTILE_GROUPS])
def test_a_hostile_field_in_samples_is_an_error_naming_file_line_and_field(tmp_path, what, fields, words):
    group = [1, 2] if fields is None else with_group(**fields)
    run = make_run(tmp_path, samples=[SAMPLE, group])
    message = html_error(tmp_path, run)
    assert "samples.jsonl, line 2" in message and words in message, message
    assert len(message) < 400, message                         # a sentence, not the file echoed


@pytest.mark.parametrize("line,words", [
    ({"step": IMG, "loss": 0.1, "reward": 0.5}, "metrics.jsonl, line 2: 'step' is"),
    ({"step": 2, "loss": 0.1, "reward": IMG}, "metrics.jsonl, step 2: 'reward' is"),
    ({"step": 2, "loss": 0.1, "entropy": [1]}, "metrics.jsonl, step 2: 'entropy' is"),
    ({"step": 2, "eval_accuracy": True}, "metrics.jsonl, step 2: 'eval_accuracy' is"),
])
def test_a_hostile_metrics_line_is_an_error(tmp_path, line, words):
    run = make_run(tmp_path)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.1, "reward": 0.1}) + "\n"
                                       + json.dumps(line) + "\n")
    assert words in html_error(tmp_path, run)


def test_non_finite_metrics_are_left_out_of_the_curves(tmp_path):
    run = make_run(tmp_path)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [
        {"step": 1, "loss": 0.1, "reward": 0.1, "entropy": float("nan")},
        {"step": 2, "loss": 0.1, "reward": float("inf"), "entropy": 0.5},
        {"step": 3, "loss": 0.1, "reward": 0.3, "entropy": 0.4}]))
    assert plots.main([str(run), "--out", str(tmp_path / "out"), "--html"]) == 0
    text = (tmp_path / "out" / "pages" / "tepo-s0.html").read_text(encoding="utf-8")
    curves = text.split('<div class="curves">', 1)[1].split("</div>", 1)[0]
    assert "nan" not in curves and "inf" not in curves
    assert "0.3 at step 3" in curves and "0.4 at step 3" in curves


HOSTILE_CONFIG = {"loss": IMG, "seed": "<script>alert(3)</script>", "beta": IMG, "preset": IMG,
                  "group_size": {"<b>": "<i>"}, "sample_every": ["</script><img src=x onerror=alert(4)>"],
                  "tr_mean_one": IMG}


def test_hostile_config_values_stay_text(tmp_path):
    """Every config.json value the page shows or uses, markup or of the wrong type: the raw page
    holds no live tag or attribute break, and the numbers the script uses are numbers or null."""
    page = write_page(tmp_path, name='tepo-"><img src=x>-s0', **HOSTILE_CONFIG)
    text = page.read_text(encoding="utf-8")
    assert text.count("<script") == 2 and text.count("</script>") == 2
    for live in ("<img", "<b>", "<i>", "onerror=\"", "alert(3)</"):
        assert live not in text, live
    data = page_data(text)
    assert data["beta"] is None and data["loss"] == IMG and data["seed"] == HOSTILE_CONFIG["seed"]
    assert "&lt;img src=x onerror=&quot;document.title=1&quot;&gt; preset" in text


def test_hostile_config_beta_nan_gives_a_page(tmp_path):
    page = write_page(tmp_path, beta=float("nan"))                   # was: ValueError in json.dumps
    assert page_data(page.read_text(encoding="utf-8"))["beta"] is None


def test_hostile_logs_stay_text_in_a_browser(tmp_path):
    """Markup in every string field a log may hold (tokens, prompt, the run's name, each config
    value) and a loss named like an Object property: the script runs, and no element is made of
    them; a link's #colour= naming such a property is ignored."""
    group = with_group(prompt=IMG + "</script><script>document.title=2</script>",
                       tokens=set_in(TOKENS, [2, 0], IMG))
    config = HOSTILE_CONFIG | {"loss": "constructor"}
    page = write_page(tmp_path, name='tepo-"><img src=x onerror=alert(5)>-s0', samples=[SAMPLE, group],
                      **config)
    for fragment in ("", "#step=3&colour=__proto__", "#step=3&colour=constructor&token=1.1"):
        dom, console = dump_dom(page, tmp_path, fragment)
        assert_ran(dom, console, sum(MASK[0]) + sum(MASK[1]) + sum(MASK[2]))
        tags = elements(dom)
        assert not {"img", "b", "i"} & {tag for tag, _ in tags} and [t for t, _ in tags].count("script") == 2
        assert not [(tag, name) for tag, attrs in tags for name, _ in attrs if name.startswith("on")]
        assert "<title>1</title>" not in dom and "<title>2</title>" not in dom       # no handler ran
        assert '<button data-mode="grpo" class="on">' in dom          # the loss "constructor" is no mode


def elements(dom):
    """[(tag, [(attribute, value)])] of every element of a page, as an HTML parser reads it."""
    from html.parser import HTMLParser
    found = []
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: found.append((tag, attrs))
    parser.feed(dom)
    return found


def test_bytes_that_are_not_utf8_are_an_error_naming_the_line_unless_cut_off_last(tmp_path, capsys):
    run = make_run(tmp_path, samples=[SAMPLE, SAMPLE])
    good = (run / "samples.jsonl").read_bytes()
    (run / "samples.jsonl").write_bytes(good.replace(b"Q: 7", b"Q: \xff7", 1))
    assert "samples.jsonl, line 1: not valid JSON" in html_error(tmp_path, run)
    (run / "samples.jsonl").write_bytes(good + '{"step": 4, "prompt": "caf\u00e9'.encode()[:-1])
    assert plots.main([str(run), "--out", str(tmp_path / "out"), "--html"]) == 0     # a run still writing
    assert "skipping an incomplete last line" in capsys.readouterr().err


def test_lone_surrogates_in_logs_give_a_page(tmp_path):
    """JSON may hold a lone surrogate (\\ud800), and a directory name undecodable bytes: the page
    is still written, the character shown escaped (was: UnicodeEncodeError writing the page)."""
    page = write_page(tmp_path, samples=[with_group(prompt="a\ud800b")], preset="x\udcffy")
    text = page.read_text(encoding="utf-8")
    assert "x\\udcffy preset" in text and page_data(text)["groups"][0]["prompt"] == "a\ud800b"
