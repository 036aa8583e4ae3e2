"""Tests for plots.py on small hand-made logs (no training)."""
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

import plots
from experiments import tables
from losses import LOSSES

PNG = b"\x89PNG\r\n\x1a\n"


def make_run(root, loss, seed, steps=12, partial=False, samples=True):
    run = root / f"{loss}-s{seed}"
    run.mkdir()
    config = {"loss": loss, "seed": seed, "preset": "tiny", "group_size": 4}
    (run / "config.json").write_text(json.dumps(config))
    lines = [json.dumps({"step": 0, "eval_accuracy": 0.2, "eval_strict": 0.05, "eval_n": 500})]
    for s in range(1, steps + 1):
        lines.append(json.dumps({"step": s, "loss": 0.01 * s, "reward": 0.2 + 0.02 * s,
                                 "entropy": 1.0 - 0.01 * s * (seed + 1), "grad_norm": 0.5 + (s % 3),
                                 "kl": 0.001 * s, "truncated_frac": 0.1 * seed,
                                 "clip_frac": 0.01 * (s == 1)}))
    lines.append(json.dumps({"step": steps, "eval_accuracy": 0.3 + 0.1 * seed,
                             "eval_strict": 0.1 + 0.1 * seed, "eval_n": 500}))
    text = "\n".join(lines) + "\n"
    if partial:
        text += '{"step": 13, "loss": 0.1, "rew'          # a run still writing its next line
    (run / "metrics.jsonl").write_text(text)
    if samples:
        (run / "samples.jsonl").write_text(json.dumps(SAMPLE) + "\n")
    return run


def runs_with(root, configs):
    """A seed-0 run per (loss, config fields), each in a folder of its own: [run dir]."""
    dirs = []
    for i, (loss, extra) in enumerate(configs):
        (root / str(i)).mkdir()
        run = make_run(root / str(i), loss, 0)
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps(dict(config, **extra)))
        dirs.append(run)
    return dirs


TOKENS = [["7", "+", "5", "=", "1", "2", "\n", "#", "#", "#", "#", " ", "1", "2", "<|endoftext|>"],
          ["$", "\\", "_", "^", "{", "}", "%", "\n", "#", "#", "#", "#", " ", "9", "<|endoftext|>"],
          ["1", "0", "\n", "\t", "#", "#", "#", "#", " ", "1", "0", "<|endoftext|>", "", "", ""],
          ["$x^2$", " ", "=", " ", "4", "<|endoftext|>", "", "", "", "", "", "", "", "", ""]]
MASK = [[1] * 15, [1] * 15, [1] * 12 + [0] * 3, [1] * 6 + [0] * 9]
g = torch.Generator().manual_seed(0)
SAMPLE = {"step": 10, "prompt": "Q: Mia has 7 $apples$ and buys 5 more.\nA: ",
          "completions": ["a", "b", "c", "d"], "tokens": TOKENS, "mask": MASK,
          "logp": torch.log(torch.rand(4, 15, generator=g) * 0.98 + 0.01).tolist(),
          "entropy": (torch.rand(4, 15, generator=g) * 2).tolist(),
          "advantages": [1.3, -0.4, 0.5, -1.4], "rewards": [1.1, 0.0, 1.0, 0.0]}


def assert_png(path):
    assert path.read_bytes()[:8] == PNG
    image = plt.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 400


def test_all_figures_from_several_runs(tmp_path):
    runs = [make_run(tmp_path, loss, seed) for loss in LOSSES for seed in (0, 1)]
    out = tmp_path / "fig"
    assert plots.main([str(r) for r in runs] + ["--out", str(out), "--table"]) == 0
    for name in ["entropy", "grad_norm", "reward", "eval_accuracy", "summary", "token_weights"]:
        assert_png(out / f"{name}.png")
    assert (out / "results.md").exists()


def test_one_partial_run_without_samples(tmp_path, capsys):
    run = make_run(tmp_path, "tepo", 0, partial=True, samples=False)
    out = tmp_path / "fig"
    assert plots.main([str(run), "--out", str(out)]) == 0
    assert "incomplete last line" in capsys.readouterr().err
    assert_png(out / "summary.png")
    assert not (out / "token_weights.png").exists()
    assert len(plots.read_run(run)["train"]) == 12


def test_directory_without_metrics_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        plots.main([str(tmp_path / "empty"), "--out", str(tmp_path / "fig")])


def test_empty_metrics_file_still_draws_empty_axes(tmp_path):
    run = make_run(tmp_path, "grpo", 0, samples=False)
    (run / "metrics.jsonl").write_text("")
    assert plots.main([str(run), "--out", str(tmp_path / "fig")]) == 0
    assert_png(tmp_path / "fig" / "summary.png")


def test_token_weight_rows_are_what_the_losses_return():
    weights = plots.token_weights(SAMPLE)
    logp, mask = torch.tensor(SAMPLE["logp"]), torch.tensor(SAMPLE["mask"], dtype=torch.float32)
    entropy, adv = torch.tensor(SAMPLE["entropy"]), torch.tensor(SAMPLE["advantages"])
    for name, fn in LOSSES.items():
        _, info = fn(logp, logp, None, adv, mask, entropy, beta=0.0)
        assert torch.equal(weights[name][0], info["weights"])
    _, tepo_info = LOSSES["tepo"](logp, logp, None, adv, mask, entropy, beta=0.0)
    assert torch.equal(weights["tepo"][1], tepo_info["kl_mask"])
    assert not torch.equal(weights["tr_grpo"][0], weights["grpo"][0])


def test_special_characters_render(tmp_path):
    plots.token_figure(SAMPLE, tmp_path / "t.png")      # $, \, ^, _, {} and newlines: no mathtext errors
    assert_png(tmp_path / "t.png")
    assert plots.show("\n") == "⏎" and plots.show("") == "∅"


@pytest.mark.parametrize("tr_mean_one, label", [(False, "tr_grpo"), (True, "tr_grpo (mean 1)")])
def test_token_figure_says_which_tr_grpo_weights_it_draws(tmp_path, monkeypatch, tr_mean_one, label):
    """The figure of a --tr-mean-one run draws that control's mean-1 weights and says so in its legend."""
    figures, close = [], plots.plt.close
    monkeypatch.setattr(plots.plt, "close", figures.append)     # keep the figure to read it back
    plots.token_figure(SAMPLE, tmp_path / "t.png", tr_mean_one=tr_mean_one)
    legend = [t.get_text() for ax in figures[0].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert legend == ["grpo (always 1)", label, "cw_grpo", "tepo (always 1)"]
    drawn = next(c for ax in figures[0].axes for c in ax.collections if c.get_label() == label)
    expected = plots.token_weights(SAMPLE, tr_mean_one=tr_mean_one)["tr_grpo"][0]
    assert drawn.get_offsets()[:, 1].tolist() == pytest.approx(
        expected[torch.tensor(SAMPLE["mask"]) > 0].tolist())
    close(figures[0])


def test_table_numbers(tmp_path):
    runs = [plots.read_run(make_run(tmp_path, "grpo", s)) for s in (0, 1)]
    table = tables.summary_table(runs)
    row = [l for l in table.splitlines() if l.startswith("| grpo")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Two seeds a and b: the mean, and the t interval with 1 degree of freedom, 12.706 standard
    # errors of |a - b| / 2 each way: 0.635 for seeds 0.1 apart.
    assert cells == ["grpo", "2",
                     "0.350 (−0.29 to 0.99)",   # held-out accuracy at the end: 0.3 and 0.4
                     "0.150 (−0.49 to 0.79)",   # strict: 0.1 and 0.2
                     "0.850 (0.21–1.49)",       # entropy over steps 8..12: 1 - 0.01 * 10 * (seed + 1)
                     "1.500 (1.50–1.50)",       # grad norm 0.5 + (s % 3) over s = 1..12: mean 1.5 ...
                     "2.500 (2.50–2.50)",       # ... and max 2.5
                     "0.050 (−0.59 to 0.69)",   # truncated: 0.1 * seed
                     "0.001 (0.00–0.00)"]       # clip_frac 0.01 at step 1 of 12
    assert "Held-out accuracy at step 0: 0.200 (strict 0.050)." in table
    assert math.isclose(plots.ema([1, 0], 0.5)[-1], 0.5)


def test_table_adds_what_acts_where_it_was_logged(tmp_path):
    """abs_log_ratio and kl_mask_frac get columns once a run logs them. A run with beta = 0
    (older logs carry kl_mask_frac there too) is left out of kl_mask_frac: its mask multiplied
    nothing."""
    runs = []
    for i, (loss, beta) in enumerate([("grpo", 0.04), ("tepo", 0.04), ("tepo", 0.0)]):
        (tmp_path / str(i)).mkdir()
        run = make_run(tmp_path / str(i), loss, i)
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps(dict(config, beta=beta)))
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for line in lines:
            if "loss" in line:
                line["abs_log_ratio"] = 0.01 * (i + 1)
                if loss == "tepo":
                    line["kl_mask_frac"] = 0.1 * (i + 1)
        (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        runs.append(plots.read_run(run))
    header, _, grpo, tepo_kl_free, tepo = tables.summary_table(runs).splitlines()[:5]
    assert header.endswith("| cut off at the end | clip_frac | abs_log_ratio | kl_mask_frac |")
    assert grpo.startswith("| grpo |") and grpo.endswith("| 0.010 | – |")
    # runs of one loss with different betas are rows of their own, the beta said
    assert tepo.startswith("| tepo β=0.04 | 1 |") and tepo.endswith("| 0.020 | 0.200 |")
    assert tepo_kl_free.startswith("| tepo β=0 | 1 |")
    assert tepo_kl_free.endswith("| 0.030 | – |")                   # its mask multiplied nothing


def test_per_seed_table(tmp_path):
    runs = [plots.read_run(make_run(tmp_path, loss, s)) for loss in ("grpo", "tepo") for s in (0, 1)]
    runs = runs[:3]                                        # tepo seed 1 has not run
    assert tables.per_seed_table(runs).splitlines() == [
        "| loss | seed 0 | seed 1 |", "|---|---|---|",
        "| grpo | 0.300 (0.100) | 0.400 (0.200) |",
        "| tepo | 0.300 (0.100) | – |"]


def test_dynamics_table_by_hand(tmp_path):
    """grad_norm 1.5, 2.5, 0.5, ... (0.5 + s % 3): steps change by 1, 2, 1, ... (15 over 11
    changes) against a mean of 1.5, i.e. 0.91; largest 2.5 over median 1.5, 1.67. Entropy
    1 - 0.01 s (seed + 1); truncated 0.1 seed; KL 0.001 s, median of steps 8-12: 0.01. A run with
    beta = 0 has no KL; a seed that has not run, and a metric never logged (completion_len), a
    dash and no column."""
    runs = [make_run(tmp_path, "grpo", 0), make_run(tmp_path, "grpo", 1), make_run(tmp_path, "tepo", 0)]
    (runs[2] / "config.json").write_text(json.dumps({"loss": "tepo", "seed": 0, "beta": 0.0}))
    assert tables.dynamics_table([plots.read_run(r) for r in runs]).splitlines() == [
        "| loss, seeds 0 / 1 | cut off, first → last | entropy, first → last | KL at the end "
        "| grad norm, step-to-step change / mean | grad norm, largest / median | held-out (strict) |",
        "|---|---|---|---|---|---|---|",
        "| grpo | 0% → 0% / 10% → 10% | 0.99 → 0.88 / 0.98 → 0.76 | 0.01 / 0.01 | 0.91 / 0.91 "
        "| 1.67 / 1.67 | 0.300 (0.100) / 0.400 (0.200) |",
        "| tepo | 0% → 0% / – | 0.99 → 0.88 / – | – / – | 0.91 / – | 1.67 / – "
        "| 0.300 (0.100) / – |"]


def test_a_step_fp16_skipped_has_no_gradient_norm(tmp_path):
    """A step whose fp16 gradients overflowed logs grad_norm Infinity and skipped_updates 1 (the
    scaler skipped it): the norms of the other 11 steps make the tables and the figures. Without
    step 4 (1.5), the steps change by 15 over 10 changes against a mean of 16.5 / 11 = 1.5, i.e.
    1.00; largest 2.5 over median 1.5, 1.67."""
    run = make_run(tmp_path, "grpo", 0)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    records[4].update(grad_norm=float("inf"), skipped_updates=1)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "Infinity" in (run / "metrics.jsonl").read_text()
    row = tables.dynamics_table([plots.read_run(run)]).splitlines()[2]
    assert row.endswith("| 1.00 | 1.67 | 0.300 (0.100) |"), row
    assert "| 1.500 | 2.500 |" in tables.summary_table([plots.read_run(run)])      # grad norm mean, max
    assert plots.main([str(run), "--out", str(tmp_path / "f")]) == 0


def test_steps_with_no_gradient_are_left_out_of_the_smoothness(tmp_path):
    """A run collapsed onto one answer a prompt (TEPO's long seed 0): from step 5 on every group's
    rewards are equal (frac_zero_std 1), so the advantages and the gradient are exactly 0, and
    the median gradient norm is 0. The smoothness is that of steps 1-4, which moved the model:
    1.5, 2.5, 0.5, 1.5 change by 1, 2, 1 (4/3) against a mean of 1.5, i.e. 0.89; largest 2.5
    over median 1.5, 1.67. A run with one such step has no smoothness: dashes. The table of
    groups with no signal: step 0 is step 1's 0.5, step 12 the mean of steps 8-12, 1.00."""
    def collapsed(root, seed, moving):
        run = make_run(root, "tepo", seed)
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for r in records:
            if "grad_norm" in r:
                r["frac_zero_std"] = 0.5 if r["step"] <= moving else 1.0
                r["grad_norm"] = r["grad_norm"] if r["step"] <= moving else 0.0
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return plots.read_run(run)
    runs = [collapsed(tmp_path, 0, moving=4), collapsed(tmp_path, 1, moving=1)]
    row = tables.dynamics_table(runs).splitlines()[2]
    assert "| 0.89 / – | 1.67 / – |" in row, row
    no_signal = tables.over_time_table(runs).split("no learning signal (every reward in the group equal)")[1]
    assert no_signal.splitlines()[-1] == "| tepo | 0.50 (0.5–0.5) | 1.00 (1.0–1.0) |"
    assert plots.main([str(r["dir"]) for r in runs] + ["--out", str(tmp_path / "f"), "--table"]) == 0
    runs[0]["train"][1]["grad_norm"] = 30.0                             # step 2: 2.5 -> 30, a spike
    fig, ax = plt.subplots()
    plots.draw_metric(ax, runs[:1], "grad_norm", 0.8)
    assert ax.get_yscale() == "log" and "(log scale; 0 off the axis)" in ax.get_ylabel()
    plt.close(fig)


def test_over_time_table_by_hand(tmp_path):
    """Runs evaluated at steps 0, 5 and 10 (accuracy 0.2, 0.25 + 0.1 seed, 0.3 + 0.1 seed):
    entropy 1 - 0.01 s (seed + 1) averaged over steps 1-5 and 6-10 is 0.97 and 0.92 for seed
    0, 0.94 and 0.84 for seed 1 (step 0: step 1's, 0.99 and 0.98); the share cut off is 0.1 seed
    at every step. A TEPO run stopped after step 5 has dashes where it did not get; results.md
    gets the table only for such runs."""
    def evaluated(root, loss, seed, stop=None):
        run = make_run(root, loss, seed, steps=10)
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        at5 = json.dumps({"step": 5, "eval_accuracy": 0.25 + 0.1 * seed, "eval_n": 500}) + "\n"
        lines.insert(6, at5)                                # after step 5's training line
        (run / "metrics.jsonl").write_text("".join(lines[:stop]))
        return plots.read_run(run)
    runs = [evaluated(tmp_path, "grpo", 0), evaluated(tmp_path, "grpo", 1),
            evaluated(tmp_path, "tepo", 0, stop=7)]
    assert tables.over_time_table(runs).splitlines() == [
        "Held-out accuracy at each evaluation:", "",
        "| loss | step 0 | step 5 | step 10 |", "|---|---|---|---|",
        "| grpo | 0.200 (0.20–0.20) | 0.300 (−0.34 to 0.94) | 0.350 (−0.29 to 0.99) |",   # ± 12.706 |a-b|/2
        "| tepo | 0.200 | 0.250 | – |", "",
        "Entropy around each evaluation (the mean of the 5 steps up to it; at step 0, the first step's):",
        "",
        "| loss | step 0 | step 5 | step 10 |", "|---|---|---|---|",
        "| grpo | 0.985 (0.92–1.05) | 0.955 (0.76–1.15) | 0.880 (0.37–1.39) |",
        "| tepo | 0.990 | 0.970 | – |", "",
        "Share of completions cut off at the token budget around each evaluation (the mean of the 5"
        " steps up to it; at step 0, the first step's):", "",
        "| loss | step 0 | step 5 | step 10 |", "|---|---|---|---|",
        "| grpo | 0.050 (−0.59 to 0.69) | 0.050 (−0.59 to 0.69) | 0.050 (−0.59 to 0.69) |",
        "| tepo | 0.000 | 0.000 | – |"]                  # no completion_len logged: no table of it
    assert plots.main([str(r["dir"]) for r in runs] + ["--out", str(tmp_path / "f"), "--table"]) == 0
    assert "Held-out accuracy at each evaluation" in (tmp_path / "f" / "results.md").read_text()
    plain = [plots.read_run(make_run(tmp_path / "f", "grpo", 0))]          # evaluated at start and end
    assert plots.main([str(plain[0]["dir"]), "--out", str(tmp_path / "g"), "--table"]) == 0
    assert "at each evaluation" not in (tmp_path / "g" / "results.md").read_text()


def test_table_of_one_seed_and_of_old_logs(tmp_path):
    run = make_run(tmp_path, "tepo", 3)
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    for l in lines:                                        # a log written before eval_strict existed
        l.pop("eval_strict", None)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(l) for l in lines) + "\n")
    row = tables.summary_table([plots.read_run(run)]).splitlines()[2]
    assert row.startswith("| tepo | 1 | 0.600 | – | ")       # one seed: the value alone; no strict: a dash


def test_a_gradient_norm_spike_puts_its_panel_on_a_log_axis(tmp_path):
    """One step at 30 among steps near 0.6 would flatten the rest against zero on a linear axis
    (TR-GRPO's long run has one): the panel goes to a log axis, and its label says so. Without
    a spike (the short runs) it stays linear."""
    assert plots.spiky([0.6, 0.5, 0.7, 30.0]) and not plots.spiky([0.6, 0.5, 0.7, 4.0])
    assert not plots.spiky([]) and not plots.spiky([0.0, 0.0, 1.0])    # a log axis cannot show 0
    calm = make_run(tmp_path, "grpo", 0)
    run = make_run(tmp_path, "tr_grpo", 0)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"grad_norm": 0.5', '"grad_norm": 30.0')     # step 3: 0.5 -> 30
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for runs, scale in [([calm], "linear"), ([calm, run], "log")]:
        fig, ax = plt.subplots()
        plots.draw_metric(ax, [plots.read_run(r) for r in runs], "grad_norm", 0.8)
        assert ax.get_yscale() == scale and ("log scale" in ax.get_ylabel()) == (scale == "log")
        plt.close(fig)


def test_token_figure_uses_the_last_group_with_mixed_rewards():
    same, mixed = {"step": 1, "rewards": [1.0, 1.0]}, {"step": 2, "rewards": [0.0, 1.1]}
    assert plots.pick_group([mixed, dict(same, step=3)])["step"] == 2
    assert plots.pick_group([same, dict(same, step=3)])["step"] == 3      # none mixed: the last



CONTROLS = ("grpo-beta0", "tepo-fullkl", "tr_grpo-mean1")       # compare.CONTROLS, without importing train


@pytest.mark.parametrize("logs, figures, whole, over_time", [   # over_time: evaluated every 25 steps
    (["compare-smol"], "figures", (LOSSES, (0, 1, 2)), False),
    (["compare-smol-active"], "figures/active", (LOSSES, (0, 1, 2)), False),
    (["compare-smol-long"], "figures/long", None, True),
    (["compare-tiny"], "figures/tiny", (LOSSES, (0, 1)), True),
    (["compare-smol-active", "compare-smol-active-controls"], "figures/controls", None, False),
    (["evidence-smol-active"], "figures/evidence", None, False)])    # the runs so far (test_compare.py)
def test_the_readme_results_are_redrawn_from_the_shipped_logs(tmp_path, logs, figures, whole, over_time):
    """`make figures` redraws the README's figures and tables from logs/ alone; each table it
    writes is in docs/results.md (the summary with intervals, each arm against its reference,
    every run's final accuracy, the run-by-run dynamics and, for the settings evaluated every 25
    steps, the tables over time) whole: header, separator, rows, in order. Neither can drift
    from the logs: a number edited by hand goes red, and so does a run added without redrawing.
    The 15-step settings and the tiny one ship all their runs; the 200-step one and the controls,
    whichever runs they have so far (the controls beside the twelve smol-active runs)."""
    repo = Path(__file__).resolve().parents[1]
    runs = [p for d in logs for p in sorted((repo / "logs" / d).glob("*-s*")) if p.is_dir()]  # make's order
    if whole:
        names, seeds = whole
        assert {r.name for r in runs} == {f"{loss}-s{seed}" for loss in names for seed in seeds}
    if logs[-1] == "compare-smol-active-controls":          # the twelve, and whichever controls ran
        assert set(LOSSES) < {r.name.rsplit("-s", 1)[0] for r in runs} <= set(LOSSES) | set(CONTROLS)
    elif not runs:
        pytest.skip("no long runs shipped yet")
    for run in runs:
        assert {"config.json", "metrics.jsonl", "samples.jsonl"} <= {p.name for p in run.iterdir()}
    assert plots.main([str(r) for r in runs] + ["--out", str(tmp_path), "--table"]) == 0
    readme = (repo / "README.md").read_text(encoding="utf-8")
    results = (repo / "docs" / "results.md").read_text(encoding="utf-8")
    written = (tmp_path / "results.md").read_text()
    tables = re.findall(r"(?m)(?:^\|.*\n)+", written)
    losses = {r.name.rsplit("-s", 1)[0] for r in runs}
    per_loss = [t for t in tables if not t.startswith("| arm")]
    assert [len(t.splitlines()) for t in per_loss] == [2 + len(losses)] * (3 + 5 * over_time)
    compared = [t for t in tables if t.startswith("| arm")]       # the losses, then the controls
    assert len(compared) in (1, 2) and sum(len(t.splitlines()) - 2 for t in compared) == len(losses) - 1
    for table in tables:
        assert table in results, "docs/results.md table != make figures:\n" + table
    assert "| loss" not in readme       # the README states the results in short, results.md has the tables
    assert written == (repo / "docs" / figures / "results.md").read_text()
    for name in ["summary.png", "token_weights.png"] + ["families.png"] * bool(plots.families(
            [plots.read_run(r) for r in runs])):
        assert_png(repo / "docs" / figures / name)


def test_the_controls_are_told_apart_from_the_losses(tmp_path):
    """A control's runs (docs/METHODS.md) get a row and a dashed line of their own, in the loss's
    colour, next to the loss they change: what it changes is in the label; a second control or
    reading of the same loss is dotted, so that the two are not the same line."""
    configs = [("grpo", {"beta": 0.04}), ("grpo", {"beta": 0.0}), ("tr_grpo", {"beta": 0.04}),
               ("tr_grpo", {"beta": 0.04, "tr_mean_one": True}), ("tepo", {"beta": 0.04}),
               ("tepo", {"beta": 0.04, "tepo_full_kl_beta": 0.04}),
               ("tepo", {"beta": 0.04, "tepo_token_ratio": True})]
    runs = [plots.read_run(d) for d in runs_with(tmp_path, configs)]
    assert [label for label, _ in plots.by_loss(runs)] == [
        "grpo β=0", "grpo β=0.04", "tr_grpo", "tr_grpo mean-1 w", "tepo", "tepo + full KL",
        "tepo token ratio"]
    fig, ax = plt.subplots()
    plots.draw_metric(ax, runs, "entropy", 0.8)
    bold = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert bold["tepo + full KL (1 seed)"].get_linestyle() == "--"
    assert bold["tepo (1 seed)"].get_linestyle() == "-"
    assert bold["tepo token ratio (1 seed)"].get_linestyle() == ":"            # a second reading of TEPO
    assert bold["grpo β=0 (1 seed)"].get_linestyle() == "--"                  # the KL-free control
    assert bold["grpo β=0.04 (1 seed)"].get_linestyle() == "-"
    assert bold["tepo + full KL (1 seed)"].get_color() == plots.COLORS["tepo"]
    plt.close(fig)


def test_each_loss_with_controls_gets_a_column_of_its_own(tmp_path):
    """Ten arms in one panel are mud: families.png gives each loss run beside a control or
    another reading a column, with the arm each is compared with (GRPO for the loss, the loss for
    its controls) and nothing else. Four plain losses have no column, so no families.png."""
    configs = [("grpo", {"beta": 0.04}), ("grpo", {"beta": 0.0}), ("tr_grpo", {"beta": 0.04}),
               ("tr_grpo", {"beta": 0.04, "tr_mean_one": True}), ("cw_grpo", {"beta": 0.04}),
               ("tepo", {"beta": 0.04}), ("tepo", {"beta": 0.04, "tepo_token_ratio": True})]
    dirs = runs_with(tmp_path, configs)
    runs = [plots.read_run(d) for d in dirs]
    columns = plots.families(runs)
    named = [(loss, [plots.variant(r) + f" {r['config']['beta']:g}" for r in arms]) for loss, arms in columns]
    assert named == [
        ("grpo", ["grpo 0.04", "grpo 0"]),                      # the KL-free control against GRPO with its KL
        ("tr_grpo", ["grpo 0.04", "tr_grpo 0.04", "tr_grpo mean-1 w 0.04"]),
        ("tepo", ["grpo 0.04", "tepo 0.04", "tepo token ratio 0.04"])]         # CW-GRPO has no control here
    assert plots.main([str(d) for d in dirs] + ["--out", str(tmp_path / "with")]) == 0
    assert_png(tmp_path / "with" / "families.png")
    plain = [dirs[i] for i in (0, 2, 4, 5)]
    assert plots.families([plots.read_run(d) for d in plain]) == []
    assert plots.main([str(d) for d in plain] + ["--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "families.png").exists()


def test_a_damaged_config_or_a_metric_that_is_no_number_is_named_not_a_traceback(tmp_path):
    """plots.read_run: a cut-off config.json, one that is not an object, and a grad_norm written as
    text each stop with one sentence naming the file."""
    run = make_run(tmp_path, "grpo", 0)
    text = (run / "config.json").read_text()
    for damaged in (text[: len(text) // 2], "[1, 2]"):
        (run / "config.json").write_text(damaged)
        with pytest.raises(SystemExit, match="config.json is not a JSON object"):
            plots.read_run(run)
    (run / "config.json").write_text(text)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"grad_norm": ', '"grad_norm": "x" , "was": ', 1)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit, match="'grad_norm' is 'x', not a number"):
        plots.read_run(run)


def test_the_tables_say_which_machines_the_runs_ran_on(tmp_path):
    """config.json's machine record (the last entry: where the run ended), counted per machine;
    runs from before the record say so."""
    runs = [plots.read_run(make_run(tmp_path, "grpo", s)) for s in (0, 1, 2)]
    record = dict(cpu="AMD EPYC", cpu_capability="AVX512", cores=2, torch="2.13.0", gpu=None, from_step=0)
    runs[0]["config"]["machine"] = [record]
    runs[1]["config"]["machine"] = [dict(record, cpu_capability="AVX2"), record]    # resumed elsewhere
    assert tables.machines(runs) == "AMD EPYC (AVX512, 2 cores): 2 runs; not recorded: 1 run"


def test_the_tables_say_whether_a_verdict_leans_on_the_less_common_machine(tmp_path):
    """Where runs ran on two machines, the note under Machines compares the cells resolved with
    every run and with the most common machine's runs alone. tr_grpo's held-out accuracy 0.60/0.62
    against grpo's 0.50/0.52/0.48/0.51 is resolved (+0.1075, Welch's interval +0.06 to +0.15); left
    with one seed of tr_grpo, the cell has no interval."""
    record = dict(cpu="AMD EPYC", cpu_capability="AVX512", cores=2, torch="2.13.0", gpu=None, from_step=0)
    runs = []
    for loss, accuracies in [("grpo", (0.50, 0.52, 0.48, 0.51)), ("tr_grpo", (0.60, 0.62))]:
        (tmp_path / loss).mkdir()
        for seed, accuracy in enumerate(accuracies):
            run = plots.read_run(make_run(tmp_path / loss, loss, seed))
            run["eval"][-1]["eval_accuracy"] = accuracy
            run["config"]["machine"] = [record]
            runs.append(run)
    assert tables.machine_check(runs) == ""                                  # one machine: nothing to say
    held_out = ("tr_grpo", "grpo", "held-out acc. at the end")
    c = tables.comparisons(runs)[2][held_out]
    assert c.resolved and (round(c.diff, 4), round(c.lo, 2), round(c.hi, 2)) == (0.1075, 0.06, 0.15)
    runs[-1]["config"]["machine"] = [dict(record, cpu_capability="AVX2")]    # tr_grpo seed 1 elsewhere
    check = tables.machine_check(runs)
    assert check.startswith("With only the 5 runs on AMD EPYC (AVX512, 2 cores), the other 1 left out")
    assert "no longer resolved: tr_grpo − grpo, held-out acc. at the end" in check
    assert tables.comparisons([r for r in runs if r is not runs[-1]])[2][held_out] is None
    assert check in tables.results_tables(runs)
    runs[-1]["config"]["machine"] = [record]
    runs[3]["config"]["machine"] = [dict(record, cpu_capability="AVX2")]     # grpo seed 3: then 2 vs 3
    assert tables.machine_check(runs).endswith("the same 1 comparison is resolved.")


def test_the_notes_under_the_tables_follow_the_seeds_there_are(tmp_path):
    """The sentences under the tables say what an interval and a p can do at the seed counts the
    tables hold, not at three seeds always (by hand: t(0.975) is 12.71 at 1 df, 4.30 at 2, 2.78 at
    4, 2.31 at 8; fully apart, 2 against 2 gives p = 2/C(4, 2) = 0.33, 3 against 3 2/C(6, 3) = 0.10,
    5 against 5 2/C(10, 5) = 0.0079, 3 against 2 1/C(5, 2) = 0.10)."""
    assert tables.t_note([]) == ""
    runs = {s: plots.read_run(make_run(tmp_path, "grpo", s)) for s in (0, 1, 2)}
    (tmp_path / "tr").mkdir()
    tr = [plots.read_run(make_run(tmp_path / "tr", "tr_grpo", s)) for s in (0, 1)]
    assert tables.t_note([runs[0]]) == ""                                      # one seed: the mean alone
    assert tables.t_note([runs[0], runs[1]]).startswith("With 2 seeds the interval is 12.71 standard errors")
    assert tables.t_note([*runs.values(), *tr]).startswith(
        "With 2 seeds the interval is 12.71 standard errors wide each way, with 3 seeds 4.30, and can")
    assert tables.comparison_note([(3, 3)]).startswith(
        "With 3 seeds against 3 the permutation p cannot go below 0.10, and Welch's t multiplier is "
        "2.78 to 4.30 standard errors, so")
    assert ("5 seeds against 5 the permutation p cannot go below 0.0079, and Welch's t multiplier is "
            "2.31 to 2.78") in tables.comparison_note([(5, 5)])
    both = tables.comparison_note([(2, 3), (2, 2), (3, 2)])
    assert both.startswith("With 2 seeds against 2 the permutation p cannot go below 0.33, and Welch's t "
                           "multiplier is 4.30 to 12.71 standard errors; with 3 seeds against 2 the "
                           "permutation p cannot go below 0.10, and Welch's t multiplier is 3.18 to 12.71")
    assert tables.comparison_note([]) == ""
    assert "With 3 seeds against 2" in tables.comparison_table([*runs.values(), *tr])
    assert tables.multiplicity_note(0, 0) == ""
    assert tables.multiplicity_note(36, 1).startswith(     # 36 × 0.05 = 1.8 by chance alone
        "1 of the 36 comparisons in this table is resolved; if no arm differed from its reference in "
        "anything, about 1.8 would be by chance (5% each)")
    # tr_grpo − grpo, 2 vs 3 seeds: one cell per compared number the runs log (held-out, entropy, grad norm)
    table = tables.comparison_table([*runs.values(), *tr])
    row = next(line for line in table.splitlines() if line.startswith("| tr_grpo − grpo"))
    cells, bold = len(row.split("|")) - 4, row.count("**") // 2
    assert f"{bold} of the {cells} comparisons in this table" in table


def test_pass_at_k_is_tabled_where_it_was_logged(tmp_path):
    """pass@1 and pass@k at the last evaluation get a column each (mean over seeds and interval), and
    step 0's are given as a mean over all runs; runs that logged none get neither; two k's cannot
    share a table."""
    runs = []
    for s, (p1, pk) in enumerate([(0.25, 0.5), (0.375, 0.75)]):
        run = make_run(tmp_path, "grpo", s)
        lines = (run / "metrics.jsonl").read_text().splitlines()
        for i in (0, len(lines) - 1):
            record = json.loads(lines[i])
            at_end = i > 0
            record.update(eval_pass_at_1=p1 if at_end else 0.125,
                          eval_pass_at_k=pk if at_end else 0.25 * (s + 1), eval_pass_k=8, eval_pass_n=32)
            lines[i] = json.dumps(record)
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        runs.append(plots.read_run(run))
    table = tables.summary_table(runs)
    header, _, row = table.splitlines()[:3]
    assert header.startswith(
        "| loss | seeds | held-out acc. | strict acc. | pass@1 at the end | pass@8 at the end |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 0.25 and 0.375: mean 0.3125, 12.706 * 0.0625 = 0.794 each way; 0.5 and 0.75: 0.625 +- 1.588
    assert cells[4:6] == ["0.312 (−0.48 to 1.11)", "0.625 (−0.96 to 2.21)"]
    assert "pass@1 0.125 (0.12–0.12) and pass@8 0.375 (−1.21 to 1.96) (the mean over all runs" in table
    assert "8 answers to each of the first 32 held-out problems" in table
    tr_run = plots.read_run(make_run(tmp_path, "tr_grpo", 0))
    assert "pass@k: k = 8" in tables.comparison_table(runs + [tr_run])
    (tmp_path / "plain").mkdir()
    plain = [plots.read_run(make_run(tmp_path / "plain", "grpo", s)) for s in (0, 1)]
    assert "pass@" not in tables.summary_table(plain)
    runs[1]["eval"][-1]["eval_pass_k"] = 4
    with pytest.raises(SystemExit, match="different k"):
        tables.summary_table(runs)


def test_the_losses_against_grpo_get_a_table_before_the_controls(tmp_path):
    """results.md puts the headline first: each loss against GRPO in a table of its own, then each
    control or other reading against the arm it changes (the KL-free GRPO against GRPO with its KL
    is a control, not a loss); the second note points at the first's for what a cell holds. Runs
    with no control get the first table alone."""
    configs = [("grpo", {"beta": 0.04}), ("grpo", {"beta": 0.0}), ("tr_grpo", {"beta": 0.04}),
               ("tr_grpo", {"beta": 0.04, "tr_mean_one": True}), ("tepo", {"beta": 0.04})]
    runs = [plots.read_run(d) for d in runs_with(tmp_path, configs)]
    text = tables.results_tables(runs)
    first, second = text.index("Each loss against GRPO:"), text.index("Each control and other reading")
    assert first < second
    rows = [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| ") and " − " in line.split("|")[1] and "reference" not in line]
    assert rows == ["tr_grpo − grpo β=0.04", "tepo − grpo β=0.04",
                    "grpo β=0 − grpo β=0.04", "tr_grpo mean-1 w − tr_grpo"]
    assert text.count("Each cell: the difference of the means") == 1
    assert "Each cell as in the table above" in text[second:]
    plain = [r for r in runs if plots.variant(r) == r["loss"] and r["config"]["beta"] == 0.04]
    alone = tables.results_tables(plain)
    assert "Each loss against GRPO:" in alone and "Each control" not in alone
