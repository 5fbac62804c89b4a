"""Insertion of one labelling per block into the BCFW atom store as a Triton kernel: one program per block.

Twin: the torch path of `AtomStore.insert_batch` (the same slots and the same store, bitwise: it only compares
and copies). A mini-batch step inserts its FW atoms; as torch ops that is about forty small kernels (the match
test over the cached labellings, the candidate and eviction argmins, the masked writes), here one launch. Store
layout and rules: `torchssvm.optim.frank_wolfe.atoms.AtomStore`.

A block that must append past the store's last slot (the store grows) gets its slot and count here but no write;
the caller grows the store and writes those rows (`AtomStore.insert_batch`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chain.chain_score_triton import label_warps


@triton.jit
def _insert_atoms_kernel(store_labels_ptr, store_loss_ptr, store_alpha_ptr, count_ptr, valid_ptr,
                         idx_ptr, labels_ptr, loss_ptr, scores_ptr, slot_ptr, append_ptr,
                         CAPACITY, W, C, cap,
                         KEEP_ACTIVE: tl.constexpr, BLOCK_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.load(idx_ptr + b).to(tl.int64)
    c = tl.load(count_ptr + i).to(tl.int64)
    w = tl.arange(0, BLOCK_W)
    wm = w < W
    new = tl.load(labels_ptr + b * W + w, mask=wm, other=0).to(tl.int32)
    atoms = store_labels_ptr + i * CAPACITY * W
    found = c * 0 - 1  # -1: not held; else its first slot
    cand = c * 0 - 1  # the first lowest-scoring inactive atom (never the truth, slot 0)
    cand_score = tl.load(scores_ptr + b * C) * 0.0
    worst = c * 0 - 1  # the first lowest-scoring atom (eviction)
    worst_score = cand_score
    for j in range(0, C):
        used = c > j
        row = tl.load(atoms + j * W + w, mask=wm, other=0)  # j < C <= CAPACITY: inside the block's slots
        same = tl.sum(((row != new) & wm).to(tl.int32), axis=0) == 0
        found = tl.where(used & same & (found < 0), j, found)
        score = tl.load(scores_ptr + b * C + j)
        alpha = tl.load(store_alpha_ptr + i * CAPACITY + j)
        replaceable = used & (j >= 1)
        take = replaceable & (alpha == 0) & ((cand < 0) | (score < cand_score))
        cand = tl.where(take, j, cand)
        cand_score = tl.where(take, score, cand_score)
        take = replaceable & ((worst < 0) | (score < worst_score))
        worst = tl.where(take, j, worst)
        worst_score = tl.where(take, score, worst_score)
    full = (c >= cap) | (cap <= 0)
    is_new = found < 0
    reuse = is_new & full & (cand >= 0)
    if KEEP_ACTIVE:  # pairwise / away steps: a full block without an inactive atom grows
        evict = is_new & (c < 0)  # never
    else:  # FW steps: it evicts its lowest-scoring atom
        evict = is_new & full & (cand < 0) & (c > 1)
    append = is_new & ~reuse & ~evict
    slot = tl.where(is_new, tl.where(reuse, cand, tl.where(evict, worst, c)), found)
    write = is_new & (slot < CAPACITY)
    # the row's mask as a vector comparison (the interpreter rejects a vector & scalar mask)
    tl.store(store_labels_ptr + (i * CAPACITY + slot) * W + w, new, mask=wm & (w * 0 + write.to(tl.int32) > 0))
    tl.store(store_loss_ptr + i * CAPACITY + slot, tl.load(loss_ptr + b), mask=write)
    tl.store(store_alpha_ptr + i * CAPACITY + slot, 0.0, mask=write)
    tl.store(count_ptr + i, c + append.to(tl.int64))
    tl.store(valid_ptr + i, 0, mask=evict)
    tl.store(slot_ptr + b, slot)
    tl.store(append_ptr + b, append.to(tl.int8))


def insert_atoms_triton(store_labels: torch.Tensor, store_loss: torch.Tensor, store_alpha: torch.Tensor,
                        count: torch.Tensor, alpha_valid: torch.Tensor, idx: torch.Tensor, labels: torch.Tensor,
                        loss: torch.Tensor, scores: torch.Tensor, cap: int, keep_active: bool):
    """`AtomStore.insert_batch` on the store's tensors, in place: labellings ``labels (B, W)`` with losses
    ``loss (B,)`` into the distinct blocks ``idx (B,)``, ``scores (B, C)`` their atoms' current scores over the
    first ``C`` slots, ``cap`` and ``keep_active`` as `AtomStore.insert`. A block appending past the last slot is
    not written (see the module docstring). Returns ``(slot (B,) long, append (B,) int8)``."""
    B, W = labels.shape
    CAPACITY = store_labels.shape[1]
    for name, t in (("store_labels", store_labels), ("store_loss", store_loss), ("store_alpha", store_alpha),
                    ("count", count), ("alpha_valid", alpha_valid)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel writes it in place)")
    slot = torch.empty(B, dtype=torch.long, device=labels.device)
    append = torch.empty(B, dtype=torch.int8, device=labels.device)
    if B == 0:
        return slot, append
    block = triton.next_power_of_2(W)
    _insert_atoms_kernel[(B,)](store_labels, store_loss, store_alpha, count, alpha_valid.view(torch.int8),
                               idx.contiguous(), labels.contiguous(), loss.contiguous(), scores.contiguous(), slot,
                               append, CAPACITY, W, scores.shape[1], int(cap), KEEP_ACTIVE=bool(keep_active),
                               BLOCK_W=block, num_warps=label_warps(block))
    return slot, append
