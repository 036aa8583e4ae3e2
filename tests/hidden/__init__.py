"""Hidden graded tests: the instructor's, never in the student's copy (assignment.INSTRUCTOR_ONLY).

One file per part, beside the visible tests/graded/ ones and marked the same way. Each
checks its part on randomized inputs against an independent computation written out in
the test (plain Python, or torch in float64), or against properties any correct answer
has, so that matching the visible tests' literals scores nothing here.

The inputs are drawn from ``TOKENREG_GRADE_SEED`` (default 0): set it to your own number
when grading, and the inputs are ones nobody has seen.
"""
import os
import random
import zlib

import torch

SEED = int(os.environ.get("TOKENREG_GRADE_SEED", "0"))


def rng(name):
    """A random.Random for one test, from the grading seed and the test's own name."""
    return random.Random(zlib.crc32(f"{SEED}:{name}".encode()))


def generator(name):
    """A torch.Generator for one test, likewise."""
    return torch.Generator().manual_seed(zlib.crc32(f"{SEED}:{name}".encode()))


def random_mask(gen, rows, cols, empty_rows=0):
    """A float64 [rows, cols] mask: each row 1 on a prefix of random length 1..cols, the
    first ``empty_rows`` rows all 0, the rows shuffled."""
    lengths = torch.randint(1, cols + 1, (rows,), generator=gen)
    lengths[:empty_rows] = 0
    lengths = lengths[torch.randperm(rows, generator=gen)]
    return (torch.arange(cols)[None] < lengths[:, None]).double()
