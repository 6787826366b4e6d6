"""Synthetic data: deterministic per seed, difficulty knob validated, even sharding enforced."""
from __future__ import annotations

import pytest
import torch

from suite.data.synthetic import SyntheticImages, SyntheticTokens, shard, step_indices


def test_same_seed_same_bytes_other_seed_other_bytes():
    a, b, c = SyntheticImages(64, seed=1), SyntheticImages(64, seed=1), SyntheticImages(64, seed=2)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)
    t1, t2 = SyntheticTokens(16, seed=3), SyntheticTokens(16, seed=3)
    assert torch.equal(t1.inputs, t2.inputs) and torch.equal(t1.inputs[:, 1:], t1.targets[:, :-1])


def test_signal_sets_difficulty_and_is_validated():
    easy, hard = SyntheticImages(256, seed=0, signal=0.6), SyntheticImages(256, seed=0, signal=0.2)
    assert torch.equal(easy.targets, hard.targets)
    # Within-class spread relative to the spread of class means is larger on the harder data.
    def spread(ds):
        x = ds.inputs.float().flatten(1)
        means = torch.stack([x[ds.targets == k].mean(0) for k in range(10)])
        within = torch.stack([x[ds.targets == k].std(0).mean() for k in range(10)]).mean()
        return (within / means.std(0).mean()).item()
    assert spread(hard) > 2 * spread(easy)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=f"signal={bad!r}"):
            SyntheticImages(8, signal=bad)


def test_global_batch_reshuffled_and_sharded_evenly():
    a, b = step_indices(100, 0, 20), step_indices(100, 1, 20)
    assert not torch.equal(a, b)
    parts = [shard(a, r, 4) for r in range(4)]
    assert torch.equal(torch.cat(parts), a) and {p.numel() for p in parts} == {5}
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        shard(a, 0, 3)
    with pytest.raises(ValueError, match="larger than the dataset"):
        step_indices(10, 0, 20)
