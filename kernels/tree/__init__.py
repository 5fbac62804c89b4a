"""Trees and generalized distance transforms: max-sum on trees with tables and on pictorial-structure trees (with
mixtures); the torch, Triton and numba twins and their dispatchers (`dispatch`)."""

from .dispatch import (
    check_quadratic_weights,
    distance_transform_1d,
    distance_transform_2d,
    mixture_tree_max_sum,
    spatial_tree_max_sum,
    tree_max_sum,
)

__all__ = ["check_quadratic_weights", "tree_max_sum", "spatial_tree_max_sum", "mixture_tree_max_sum",
           "distance_transform_1d", "distance_transform_2d"]
