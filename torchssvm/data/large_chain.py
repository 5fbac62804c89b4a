"""Seeded synthetic chains over a large label set with a sparse, Zipf-skewed bigram language model.

The "ChineseOCR regime" of GDMM (Yen et al. 2016): thousands of labels, dense low-dimensional
features, and a transition structure in which each label is followed by only a few others.
"""

from __future__ import annotations

import torch

from .._validation import check_float_dtype, check_positive_int, check_real, check_seed
from .sequence_dataset import SequenceDataset
from .streams import MODEL, SPLIT_STREAM, stream
from .synthetic import check_chain_args


def _zipf_weights(m: int, s: float) -> torch.Tensor:
    """``(m,)`` probabilities proportional to ``rank ** -s`` for ranks 1..m."""
    w = torch.arange(1, m + 1, dtype=torch.float64).pow(-s)
    return w / w.sum()


def synthetic_large_chain(split: str = "train", n: int = 1000, *, num_labels: int = 1000, num_features: int = 32,
                          min_length: int = 5, max_length: int = 15, successors: int = 8, zipf: float = 1.1,
                          noise: float = 0.28, seed: int = 0, dtype: torch.dtype = torch.float32) -> SequenceDataset:
    """Sequences from a random sparse bigram model whose parameters depend only on ``seed`` (so "train"
    and "test" share them, and their samples differ).

    The model: a Zipf(``zipf``) unigram distribution over a random permutation of the labels (a few
    labels are common, most are rare) gives the initial label. Each label has ``successors`` distinct
    allowed next labels, drawn without replacement in proportion to the unigram (so frequent labels
    are frequent successors), and weighted Zipf(``zipf``) in the order they were drawn. Each label has
    a random prototype of unit norm; a token's features are its label's prototype plus Gaussian noise of
    standard deviation ``noise`` per coordinate. At the defaults (K = 1000, D = 32) a nearest-prototype
    classifier labels about half the tokens correctly and Viterbi with the true model about 97%.
    Lengths are uniform in ``[min_length, max_length]``; labels are padded with -1 and features with 0.

    ``meta`` holds the generator parameters, ``num_bigrams`` (distinct ``(y_t, y_{t+1})`` pairs in this
    sample), ``num_allowed_bigrams`` (``num_labels * successors``) and the model itself:
    ``prototypes (K, D)``, ``initial_probs (K,)``, ``successor_table (K, S)`` (the allowed next labels
    of each label) and ``successor_probs (K, S)`` (their probabilities), all float64 / long on CPU.
    """
    n, K, D, lo, hi = check_chain_args(split, n, num_labels, num_features, min_length, max_length)
    S = check_positive_int("successors", successors)
    if S > K:
        raise ValueError(f"successors ({S}) must be <= num_labels ({K})")
    zipf = check_real("zipf", zipf)
    noise = check_real("noise", noise)
    seed = check_seed(seed)
    check_float_dtype(dtype)

    # The model: depends only on the seed and the sizes.
    g = stream(seed, MODEL)
    perm = torch.randperm(K, generator=g)
    unigram = torch.empty(K, dtype=torch.float64)
    unigram[perm] = _zipf_weights(K, float(zipf))
    # S distinct successors per label, drawn without replacement in proportion to the unigram
    # (Efraimidis-Spirakis: the S largest keys log(u) / p; their order is the draw order).
    keys = torch.rand(K, K, generator=g).log_().div_(unigram.float().clamp_min(torch.finfo(torch.float32).tiny))
    successor_table = keys.topk(S, dim=1).indices  # (K, S), in draw order
    successor_probs = _zipf_weights(S, float(zipf)).expand(K, S).contiguous()
    prototypes = torch.randn(K, D, generator=g, dtype=torch.float64)
    prototypes = prototypes / prototypes.norm(dim=1, keepdim=True).clamp_min(1e-12)

    # The sample.
    g = stream(seed, SPLIT_STREAM[split])
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    y = torch.empty((n, hi), dtype=torch.long)
    y[:, 0] = torch.multinomial(unigram, n, replacement=True, generator=g)
    for t in range(1, hi):
        slot = torch.multinomial(successor_probs[y[:, t - 1]], 1, generator=g)
        y[:, t] = successor_table[y[:, t - 1]].gather(1, slot).squeeze(1)
    valid = torch.arange(hi).unsqueeze(0) < lengths.unsqueeze(1)
    y = torch.where(valid, y, torch.full_like(y, -1))
    x = prototypes[y.clamp_min(0)] + float(noise) * torch.randn(n, hi, D, generator=g, dtype=torch.float64)
    x = (x * valid.unsqueeze(2)).to(dtype)

    pair_ok = valid[:, 1:]
    pairs = (y[:, :-1] * K + y[:, 1:])[pair_ok]
    meta = {
        "generator": "synthetic_large_chain", "split": split, "n": n, "num_labels": K, "num_features": D,
        "min_length": lo, "max_length": hi, "successors": S, "zipf": float(zipf), "noise": float(noise),
        "seed": seed, "num_bigrams": int(pairs.unique().numel()), "num_allowed_bigrams": K * S,
        "prototypes": prototypes, "initial_probs": unigram, "successor_table": successor_table,
        "successor_probs": successor_probs,
    }
    return SequenceDataset(x, y, lengths, num_labels=K, num_features=D, meta=meta, name=f"large-chain-{split}")
