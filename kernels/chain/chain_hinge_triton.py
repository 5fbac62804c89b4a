"""The margin-rescaled chain hinge's own arithmetic as two Triton kernels, one program per sequence: everything of
`StructuredHingeLoss` on a `Chain` but Viterbi itself, so that a forward and backward on CUDA launch a handful
of kernels and never wait for the device.

- `chain_hinge_prepare_triton` (forward): the loss-augmented unary ``unary + w_t [k != y_t]`` (Hamming weights ``w_t =
  loss_weight class_weight[y_t] / L``), the score of the truth, the lengths clamped to ``[1, T]`` and the target with -1
  past each length, in one pass over the unary. It also checks the values the host does not read outside debug mode
  (`torchssvm.set_debug`): a length outside ``[1, T]``, a label outside ``[0, K)`` within the length or a negative or
  non-finite loss weight makes that example's score NaN (so its loss is NaN), and every index is clamped, so bad values
  never read or write out of bounds.
- The overflow guard (`torchssvm.kernels.chain.guard_triton`), which the host cannot run on a device without reading
  the potentials' magnitudes: one launch reduces them, the prepare kernel writes the augmented unary and the truth's
  score times ``2**-s`` (``s = 0`` far from the dtype's limits: bitwise as before), and Viterbi reads the other
  potentials alike and stores the hinge times ``2**s``: finite potentials near the dtype's limits give the hinge to
  its rounding of the sums, or +inf where the hinge does not fit, never NaN.
- `chain_hinge_grad_triton` (backward): ``w_b (marginals(y_hat_b) - marginals(y_b))`` summed over the batch for
  the unary (written in full, no fill), the transitions (shared or per position), start and end (atomic adds of
  +-w into one zero-filled buffer; positions where both labellings agree are skipped, their terms cancel).

Their torch twin is the unfused path of `Chain` (`_max_oracle`'s augmentation, `chain_score_torch`,
`marginal_vjp`): the augmented unary is bitwise equal (the Hamming weights are formed in float64 in the same
order), the unary gradient too; the score of the truth and the shared-factor gradients sum in another order
(equal to rounding).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .guard_triton import chain_guard_partials, guard_shift, loss_weight_arg, pow2

# Elements of the (positions x labels) tile a program holds at once.
_TILE = 2048


def _blocks(T: int, K: int):
    block_k = min(triton.next_power_of_2(max(K, 1)), _TILE)
    block_t = max(1, min(triton.next_power_of_2(max(T, 1)), _TILE // block_k))
    return block_t, block_k


@triton.jit
def _hinge_prepare_kernel(unary_ptr, trans_ptr, start_ptr, end_ptr, len_ptr, target_ptr, lw_ptr, cw_ptr, part_ptr,
                          aug_ptr, gold_ptr, len_out_ptr, target_out_ptr,
                          T, K, lw_sb, lw_value, trans_sb, trans_st, n_parts, guard_limit,
                          HAS_LENGTHS: tl.constexpr, HAS_START: tl.constexpr, HAS_END: tl.constexpr,
                          HAS_CW: tl.constexpr, LW_TENSOR: tl.constexpr, NORMALIZE: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    dt = aug_ptr.dtype.element_ty
    # the overflow guard: every value below is the potentials' times sc = 2**-s (s = 0 far from the limits)
    sc64 = pow2(-guard_shift(part_ptr, n_parts, guard_limit, BLOCK_P))
    sc = sc64.to(dt)
    if HAS_LENGTHS:
        L_raw = tl.load(len_ptr + b).to(tl.int64)
    else:
        L_raw = T + b * 0
    bad = (L_raw < 1) | (L_raw > T)
    L = tl.minimum(tl.maximum(L_raw, 1), T)
    if LW_TENSOR:
        lw = tl.load(lw_ptr + b * lw_sb).to(tl.float64)
    else:
        lw = tl.cast(lw_value, tl.float64)
    bad = bad | ~(lw >= 0) | (lw == float("inf"))
    y_row = target_ptr + b * T
    u_row = unary_ptr + b * T * K
    a_row = aug_ptr + b * T * K
    tr_row = trans_ptr + b * trans_sb
    acc = tl.zeros([BLOCK_T], dtype=dt)
    wrong = tl.zeros([BLOCK_T], dtype=tl.int32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        inb = t < T
        valid = t < L
        y_raw = tl.load(y_row + t, mask=inb, other=0).to(tl.int64)
        wrong += (valid & ((y_raw < 0) | (y_raw >= K))).to(tl.int32)
        yc = tl.where(valid, tl.minimum(tl.maximum(y_raw, 0), K - 1), 0)
        tl.store(target_out_ptr + b * T + t, tl.where(valid, yc, -1), mask=inb)
        # the score of the truth: its unary and transition entries
        acc += tl.load(u_row + t * K + yc, mask=valid, other=0.0).to(dt) * sc
        pair = valid & (t >= 1)
        yp = tl.minimum(tl.maximum(tl.load(y_row + t - 1, mask=pair, other=0).to(tl.int64), 0), K - 1)
        acc += tl.load(tr_row + (t - 1) * trans_st + yp * K + yc, mask=pair, other=0.0).to(dt) * sc
        # Hamming weight of a mistake at t, in float64 in the torch twin's order: class weight, / L, * loss weight
        if HAS_CW:
            w = tl.load(cw_ptr + yc, mask=valid, other=0.0).to(tl.float64)
        else:
            w = tl.where(valid, 1.0, 0.0).to(tl.float64)
        if NORMALIZE:
            w = w / L.to(tl.float64)
        w = (w * lw * sc64).to(dt)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            m = inb[:, None] & (k < K)[None, :]
            off = t[:, None] * K + k[None, :]
            u = tl.load(u_row + off, mask=m, other=0.0).to(dt) * sc
            tl.store(a_row + off, u + tl.where(k[None, :] != yc[:, None], w[:, None], 0.0), mask=m)
    gold = tl.sum(acc, axis=0)
    if HAS_START:
        gold += tl.load(start_ptr + tl.minimum(tl.maximum(tl.load(y_row).to(tl.int64), 0), K - 1)).to(dt) * sc
    if HAS_END:
        gold += tl.load(end_ptr + tl.minimum(tl.maximum(tl.load(y_row + L - 1).to(tl.int64), 0), K - 1)).to(dt) * sc
    bad = bad | (tl.sum(wrong, axis=0) > 0)
    tl.store(gold_ptr + b, tl.where(bad, float("nan"), gold))
    tl.store(len_out_ptr + b, L)


def chain_hinge_prepare_triton(unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                               end: Optional[torch.Tensor], lengths: Optional[torch.Tensor], target: torch.Tensor,
                               loss_weight, class_weights: Optional[torch.Tensor], normalize: bool,
                               dtype: torch.dtype):
    """``(augmented unary (B, T, K), score of the target (B,), lengths (B,) long, target (B, T) long, guard)``, the
    first two times the overflow guard's ``2**-s`` (1 far from the dtype's limits; `guard_triton`); ``guard`` (a
    `ChainGuard`) is what `viterbi_triton` takes to read the other potentials alike (``guard=guard,
    scale_unary=False``).

    Args:
        unary ``(B, T, K)``, transition ``(K, K)`` or ``(B, T-1, K, K)``, start, end ``(K,)`` or None: the
            potentials, any float dtypes (read as ``dtype``).
        lengths: ``(B,)`` integer or None (every sequence has length T); not checked: a length outside
            ``[1, T]`` is clamped and the example's score is NaN.
        target: ``(B, T)`` integer; entries past the length are ignored, one outside ``[0, K)`` within it is
            clamped and makes the score NaN.
        loss_weight: a number (finite, >= 0) or a ``(B,)`` tensor (a negative or non-finite entry: NaN).
        class_weights: ``(K,)`` float64 on the device, or None.
        normalize: divide the Hamming weights by the length.
        dtype: of the augmented unary and the score (the compute dtype, float32 or float64).
    """
    B, T, K = unary.shape
    dev = unary.device
    aug = torch.empty(B, T, K, dtype=dtype, device=dev)
    gold = torch.empty(B, dtype=dtype, device=dev)
    lengths_out = torch.empty(B, dtype=torch.long, device=dev)
    target_out = torch.empty(B, T, dtype=torch.long, device=dev)
    if B == 0:
        return aug, gold, lengths_out, target_out, None
    loss_weight, lw_tensor = loss_weight_arg(loss_weight, dev)
    lw_sb = (loss_weight.stride(0) if loss_weight.shape[0] == B else 0) if lw_tensor else 0
    per_position = transition.dim() == 4
    unary, transition, target = unary.contiguous(), transition.contiguous(), target.contiguous()
    block_t, block_k = _blocks(T, K)
    start_arg = unary if start is None else start.contiguous()
    end_arg = unary if end is None else end.contiguous()
    lw_arg = loss_weight if lw_tensor else aug
    cw_arg = aug if class_weights is None else class_weights.contiguous()
    flags = dict(HAS_START=start is not None, HAS_END=end is not None, HAS_CW=class_weights is not None,
                 LW_TENSOR=lw_tensor)
    lw_value = 0.0 if lw_tensor else float(loss_weight)
    guard = chain_guard_partials(unary, transition, start, end, loss_weight, class_weights)  # one launch
    _hinge_prepare_kernel[(B,)](
        unary, transition, start_arg, end_arg, target if lengths is None else lengths.contiguous(), target,
        lw_arg, cw_arg, guard.parts, aug, gold, lengths_out, target_out,
        T, K, lw_sb, lw_value, (T - 1) * K * K if per_position else 0, K * K if per_position else 0, guard.programs,
        guard.limit(dtype), HAS_LENGTHS=lengths is not None, NORMALIZE=bool(normalize), BLOCK_T=block_t,
        BLOCK_K=block_k, BLOCK_P=guard.block(), num_warps=4, **flags)
    return aug, gold, lengths_out, target_out, guard


@triton.jit
def _hinge_grad_kernel(y_hat_ptr, y_ptr, len_ptr, w_ptr, gu_ptr, gt_ptr, gs_ptr, ge_ptr,
                       T, K, w_sb, gt_sb, gt_st,
                       UNARY: tl.constexpr, TRANS: tl.constexpr, START: tl.constexpr, END: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    acc_t = gt_ptr.dtype.element_ty
    L = tl.load(len_ptr + b).to(tl.int64)
    w = tl.load(w_ptr + b * w_sb).to(acc_t)
    h_row = y_hat_ptr + b * T
    g_row = y_ptr + b * T
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        inb = t < T
        valid = t < L
        yh = tl.maximum(tl.load(h_row + t, mask=inb, other=0), 0).to(tl.int64)
        yg = tl.maximum(tl.load(g_row + t, mask=inb, other=0), 0).to(tl.int64)
        if UNARY:
            for k0 in range(0, K, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                m = inb[:, None] & (k < K)[None, :]
                plus = tl.where(valid[:, None] & (k[None, :] == yh[:, None]), w, 0.0)
                minus = tl.where(valid[:, None] & (k[None, :] == yg[:, None]), w, 0.0)
                tl.store(gu_ptr + b * T * K + t[:, None] * K + k[None, :], (plus - minus).to(gu_ptr.dtype.element_ty),
                         mask=m)
        if TRANS:
            pair = valid & (t >= 1)
            yhp = tl.maximum(tl.load(h_row + t - 1, mask=pair, other=0), 0).to(tl.int64)
            ygp = tl.maximum(tl.load(g_row + t - 1, mask=pair, other=0), 0).to(tl.int64)
            differ = pair & ((yh != yg) | (yhp != ygp))  # where both pairs agree the two terms cancel
            base = gt_ptr + b * gt_sb + (t - 1) * gt_st
            ws = tl.zeros([BLOCK_T], dtype=acc_t) + w
            tl.atomic_add(base + yhp * K + yh, ws, mask=differ, sem="relaxed")
            tl.atomic_add(base + ygp * K + yg, -ws, mask=differ, sem="relaxed")
    # start and end: +w at y_hat's label, -w at the target's (lanes 0 and 1), unless they agree
    lane = tl.arange(0, 2)
    ws2 = tl.where(lane == 0, w, -w)
    if START:
        h0 = tl.maximum(tl.load(h_row + lane * 0), 0).to(tl.int64)
        g0 = tl.maximum(tl.load(g_row + lane * 0), 0).to(tl.int64)
        tl.atomic_add(gs_ptr + tl.where(lane == 0, h0, g0), ws2, mask=h0 != g0, sem="relaxed")
    if END:
        hl = tl.maximum(tl.load(h_row + L - 1 + lane * 0), 0).to(tl.int64)
        gl = tl.maximum(tl.load(g_row + L - 1 + lane * 0), 0).to(tl.int64)
        tl.atomic_add(ge_ptr + tl.where(lane == 0, hl, gl), ws2, mask=hl != gl, sem="relaxed")


def chain_hinge_grad_triton(y_hat: torch.Tensor, target: torch.Tensor, lengths: torch.Tensor, weight: torch.Tensor,
                            unary: torch.Tensor, transition: torch.Tensor, start: Optional[torch.Tensor],
                            end: Optional[torch.Tensor], needs, acc_dtype: torch.dtype):
    """``sum_b weight_b (marginals(y_hat_b) - marginals(target_b))`` for each potential tensor (None where
    ``needs`` is False or the tensor is absent), each in its tensor's dtype; the shared factors accumulate in
    ``acc_dtype``. ``y_hat``, ``target``: ``(B, T)`` long, -1 past ``lengths`` (``(B,)`` in ``[1, T]``);
    ``weight``: ``(B,)``, any stride."""
    B, T, K = unary.shape
    dev = unary.device
    per_position = transition.dim() == 4
    want = [bool(n) and t is not None for n, t in zip(needs, (unary, transition, start, end))]
    gu = torch.empty(B, T, K, dtype=unary.dtype, device=dev) if want[0] else None
    gt = gs = ge = flat = None
    if want[1] and not (want[2] or want[3]):  # the common case: one fill, no views
        gt = flat = torch.zeros(transition.shape, dtype=acc_dtype, device=dev)
    elif any(want[1:]):
        n_trans = transition.numel() if want[1] else 0
        n_start, n_end = (K if want[2] else 0), (K if want[3] else 0)
        flat = torch.zeros(n_trans + n_start + n_end, dtype=acc_dtype, device=dev)
        gt = flat[:n_trans].view(transition.shape) if want[1] else None
        gs = flat[n_trans:n_trans + n_start] if want[2] else None
        ge = flat[n_trans + n_start:] if want[3] else None
    if B and any(want):
        block_t, block_k = _blocks(T, K)
        dummy = flat if flat is not None else gu
        _hinge_grad_kernel[(B,)](
            y_hat.contiguous(), target.contiguous(), lengths.contiguous(), weight,
            dummy if gu is None else gu, dummy if gt is None else gt, dummy if gs is None else gs,
            dummy if ge is None else ge,
            T, K, weight.stride(0) if weight.dim() else 0,
            (T - 1) * K * K if per_position else 0, K * K if per_position else 0,
            UNARY=want[0], TRANS=want[1] and T > 1, START=want[2], END=want[3],
            BLOCK_T=block_t, BLOCK_K=block_k, num_warps=4)
    return tuple(g if g is None or g.dtype == t.dtype else g.to(t.dtype)
                 for g, t in zip((gu, gt, gs, ge), (unary, transition, start, end)))
