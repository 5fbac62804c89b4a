"""Seeded synthetic chains sampled from a random hidden Markov model with Gaussian emissions."""

from __future__ import annotations

import math

import torch

from .._validation import check_float_dtype, check_positive_int, check_real, check_seed
from .sequence_dataset import SequenceDataset
from .streams import MODEL, SPLIT_STREAM, stream


def check_chain_args(split, n, num_labels, num_features, min_length, max_length):
    """The shared arguments of the chain generators, validated: ``(n, K, D, min_length, max_length)``."""
    if split not in SPLIT_STREAM:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    n = check_positive_int("n", n)
    K = check_positive_int("num_labels", num_labels, minimum=2)
    D = check_positive_int("num_features", num_features)
    lo = check_positive_int("min_length", min_length)
    hi = check_positive_int("max_length", max_length)
    if hi < lo:
        raise ValueError(f"max_length ({hi}) must be >= min_length ({lo})")
    return n, K, D, lo, hi


def synthetic_chain(split: str = "train", n: int = 500, *, num_labels: int = 5, num_features: int = 16,
                    min_length: int = 4, max_length: int = 20, noise: float = 1.5, stickiness: float = 3.0,
                    seed: int = 0, dtype: torch.dtype = torch.float32) -> SequenceDataset:
    """Sequences from a random HMM whose parameters depend only on ``seed`` (so "train" and "test"
    share them, and their samples differ).

    Labels follow a Markov chain with random transition logits plus ``stickiness`` on the diagonal; each
    token's features are its label's random mean (unit norm scaled by 2) plus Gaussian noise of standard
    deviation ``noise``, so the unary potentials alone are ambiguous and the transitions carry signal.
    Lengths are uniform in ``[min_length, max_length]``.
    """
    n, K, D, lo, hi = check_chain_args(split, n, num_labels, num_features, min_length, max_length)
    check_real("noise", noise)
    check_real("stickiness", stickiness, minimum=-math.inf)
    seed = check_seed(seed)
    check_float_dtype(dtype)

    g = stream(seed, MODEL)
    logits = torch.randn(K, K, generator=g) + stickiness * torch.eye(K)
    trans = torch.softmax(logits, dim=1)
    init = torch.softmax(torch.randn(K, generator=g), dim=0)
    means = torch.randn(K, D, generator=g)
    means = 2.0 * means / means.norm(dim=1, keepdim=True)

    g = stream(seed, SPLIT_STREAM[split])
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    y = torch.full((n, hi), -1, dtype=torch.long)
    y[:, 0] = torch.multinomial(init, n, replacement=True, generator=g)
    for t in range(1, hi):
        y[:, t] = torch.multinomial(trans[y[:, t - 1].clamp_min(0)], 1, generator=g).squeeze(1)
    valid = torch.arange(hi).unsqueeze(0) < lengths.unsqueeze(1)
    y = torch.where(valid, y, torch.full_like(y, -1))
    x = means[y.clamp_min(0)] + noise * torch.randn(n, hi, D, generator=g)
    x = (x * valid.unsqueeze(2)).to(dtype)
    return SequenceDataset(x, y, lengths, num_labels=K, num_features=D, name=f"synthetic-{split}")
