"""Max-sum on trees with Triton kernels: levels are launched from Python (`tree_torch.tree_max_sum_generic`).

Explicit tables: one program per (example, edge of the level, block of parent labels) computes
``m[k_p] = max_{k_c} table[k_p, k_c] + belief[k_c]`` and the first maximal ``k_c``, tiling the child
labels with a running (max, argmax) that keeps the earlier tile on ties, so it agrees bitwise with
`tree_torch.explicit_level_op_torch` for any K. Spatial trees run the same schedule with the Triton 1-D
distance transform (`distance_transform_triton`) in both passes. Beliefs, backtracking and the order of
the message sums are shared with the torch twin.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import triton
import triton.language as tl

from .distance_transform_torch import distance_transform_2d
from .tree_torch import spatial_level_op, tree_max_sum_generic, tree_schedule

_BLOCK_P = 32
_BLOCK_C = 64


@triton.jit
def _tree_level_kernel(belief_ptr, table_ptr, eidx_ptr, msg_ptr, arg_ptr, n, K, table_sb,
                       BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)  # example * n + position in the level
    b = pid // n
    j = pid % n
    e = tl.load(eidx_ptr + j)
    bel_base = belief_ptr + pid * K
    tab_base = table_ptr + b * table_sb + e * K * K
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    mp = offs_p < K
    NEG = float("-inf")
    best = tl.full([BLOCK_P], NEG, dtype=belief_ptr.dtype.element_ty)
    arg = tl.zeros([BLOCK_P], dtype=tl.int64)
    for c0 in range(0, K, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        mc = offs_c < K
        bel = tl.load(bel_base + offs_c, mask=mc, other=NEG)
        tab = tl.load(tab_base + offs_p[:, None] * K + offs_c[None, :], mask=mp[:, None] & mc[None, :], other=NEG)
        s = tab + bel[None, :]
        tile_best = tl.max(s, axis=1)
        tile_arg = tl.argmax(s, axis=1).to(tl.int64) + c0
        upd = tile_best > best  # strict: an earlier tile keeps ties
        best = tl.where(upd, tile_best, best)
        arg = tl.where(upd, tile_arg, arg)
    tl.store(msg_ptr + pid * K + offs_p, best, mask=mp)
    tl.store(arg_ptr + pid * K + offs_p, arg, mask=mp)


def explicit_level_op_triton(pairwise: torch.Tensor):
    """Triton twin of `tree_torch.explicit_level_op_torch`."""
    pairwise = pairwise.contiguous()
    K = pairwise.shape[-1]
    table_sb = pairwise.shape[1] * K * K if pairwise.dim() == 4 else 0
    block_p = min(_BLOCK_P, triton.next_power_of_2(K))
    block_c = min(_BLOCK_C, triton.next_power_of_2(K))

    def op(belief, eidx):
        B, n, _ = belief.shape
        belief = belief.contiguous()
        msg = belief.new_empty(B, n, K)
        arg = torch.empty(B, n, K, dtype=torch.long, device=belief.device)
        if B * n:
            _tree_level_kernel[(B * n, triton.cdiv(K, block_p))](
                belief, pairwise, eidx.contiguous(), msg, arg, n, K, table_sb,
                BLOCK_P=block_p, BLOCK_C=block_c,
            )
        return msg, arg

    return op


def tree_max_sum_triton(unary: torch.Tensor, pairwise: torch.Tensor, parents: Sequence[int]):
    """Same contract as `tree_torch.tree_max_sum_torch`; float32 or float64."""
    return tree_max_sum_generic(unary, tree_schedule(parents), explicit_level_op_triton(pairwise))


def spatial_tree_max_sum_triton(unary, weights, rest, parents, height: int, width: int):
    """Same contract as `tree_torch.spatial_tree_max_sum_torch`, with the Triton 1-D distance transform."""
    from .distance_transform_triton import distance_transform_1d_triton

    op = spatial_level_op(weights, rest, height, width,
                          functools.partial(distance_transform_2d, gdt_1d=distance_transform_1d_triton))
    return tree_max_sum_generic(unary, tree_schedule(parents), op)
