"""The random streams of the seeded data generators.

A generator called with ``seed = s`` draws each of its parts (the model, each split, the limb angles, ...) from a
stream of its own, ``torch.Generator().manual_seed(1000 s + k)`` for a part number ``k`` in ``[0, 1000)``. So the
streams of two seeds never coincide: seed 1's model is not seeded like seed 0's training split. Part 0 is the
model (the parameters "train" and "test" share), so seed 0 draws exactly what ``manual_seed(0)`` draws.
"""

from __future__ import annotations

import torch

STREAMS_PER_SEED = 1000
MODEL, TRAIN, TEST = 0, 1, 2
SPLIT_STREAM = {"train": TRAIN, "test": TEST}


def stream(seed: int, part: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for part ``part`` of the data of seed ``seed`` (checked by `check_seed`)."""
    if not 0 <= part < STREAMS_PER_SEED:
        raise ValueError(f"part must be in [0, {STREAMS_PER_SEED}), got {part}")
    return torch.Generator().manual_seed(seed * STREAMS_PER_SEED + part)
