"""Graded: completion_mask (train.py). Literal token ids, masks written out by hand."""
import pytest
import torch

from . import load_alone

completion_mask = load_alone("train").completion_mask    # train.py without losses.py and rewards.py

pytestmark = pytest.mark.part("completion_mask")


def test_mask_from_positions_when_pad_equals_eos():
    eos = [0, 7]                        # pad id is 0, which is also an EOS id (as on Qwen)
    completions = torch.tensor([[5, 6, 0, 0, 0],     # EOS at 2, then padding (= EOS ids)
                                [7, 0, 0, 0, 0],     # the second EOS id, immediately
                                [5, 6, 5, 6, 5],     # never stopped: truncated
                                [0, 0, 0, 0, 0]])    # empty answer: the EOS itself is a token
    mask, truncated = completion_mask(completions, eos)
    assert mask.dtype.is_floating_point and truncated.dtype == torch.bool
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, False, True, False]
    assert (completions != 0).float().tolist() != mask.tolist()   # what a token-id mask would give


def test_only_the_first_eos_counts():
    completions = torch.tensor([[3, 2, 9, 2, 4, 2],
                                [9, 9, 9, 9, 9, 2],          # EOS in the last position: not truncated
                                [1, 9, 4, 4, 4, 4]])
    mask, truncated = completion_mask(completions, [2, 9])
    assert mask.tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, False, False]
    mask, truncated = completion_mask(completions, [2])
    assert mask.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, True]


def test_one_eos_id_and_one_row():
    mask, truncated = completion_mask(torch.tensor([[4, 4, 1, 1]]), [1])
    assert mask.shape == (1, 4) and mask.tolist() == [[1, 1, 1, 0]] and truncated.tolist() == [False]
