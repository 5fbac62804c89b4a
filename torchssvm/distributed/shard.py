"""Which examples a rank holds: contiguous ranges in rank order (docs/distributed.md, "What is where")."""

from __future__ import annotations

from typing import Optional


def _check_index(name: str, value, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def shard_range(n: int, rank: int, world_size: int) -> range:
    """The global examples ``range(offset, offset + n_r)`` of rank ``rank`` of ``world_size``: contiguous, the first
    ``n mod world_size`` ranks hold one example more, every example held once. A rank may hold none (``n <
    world_size``)."""
    n = _check_index("n", n)
    world_size = _check_index("world_size", world_size, 1)
    rank = _check_index("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def shard_dataset(dataset, rank: Optional[int] = None, world_size: Optional[int] = None, *, process_group=None):
    """Rank ``rank``'s examples of ``dataset`` (`shard_range`), as ``dataset.subset`` makes them (a
    `SequenceDataset`, a `MultiLabelDataset`). ``rank`` and ``world_size`` default to those of ``process_group``
    (the world group when None; torch.distributed must then be initialized)."""
    if rank is None or world_size is None:
        from .comm import resolve_group

        group = resolve_group(process_group)
        import torch.distributed as dist

        rank = dist.get_rank(group) if rank is None else rank
        world_size = dist.get_world_size(group) if world_size is None else world_size
    if not callable(getattr(dataset, "subset", None)):
        raise TypeError(f"dataset must have a subset(indices) method (SequenceDataset, MultiLabelDataset), got "
                        f"{type(dataset).__name__}")
    return dataset.subset(list(shard_range(len(dataset), rank, world_size)))
