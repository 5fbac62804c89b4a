"""Chains: Viterbi, the scores of labellings and marginals, the slack-rescaled oracle; each dispatched to its torch,
Triton or numba twin by the backend table (`backends.resolve`)."""

from __future__ import annotations

import functools

import torch

from torchssvm._validation import shape_or_type

from ..backends import NUMBA_DTYPES, resolve
from .chain_marginals_torch import chain_marginals_torch
from .chain_score_torch import chain_inner_torch, chain_labels_score_torch
from .slack_chain_torch import slack_viterbi_torch
from .viterbi_torch import viterbi_torch


def _check_chain_args(unary, lengths=None, labels=None, z=None, num_labels=None, minus=None, *,
                      values: bool = True, everywhere: bool = False) -> None:
    """The chain kernels' arguments (a ValueError / TypeError naming one), before any backend runs: the Triton
    kernels read what the shapes say (a ``z`` without its unary block, labels narrower than ``T`` or a length past
    ``T`` read out of bounds). Shapes always; the values of ``lengths`` (in ``[1, T]``) and ``labels`` (``< K``,
    in every entry with ``everywhere``, else within each length; a negative label is a placeholder the twins
    agree on: no count in the marginals, 0 in the scores) on CPU tensors only, and not twice
    (``values=False``: the numba twins check them in their loop): on a device that check would make the host wait
    in every BCFW step, and the callers (`Chain`, `ChainProblem`) check them at the boundary."""
    if unary is not None:
        if not isinstance(unary, torch.Tensor) or unary.dim() != 3:
            raise ValueError(f"unary must be a (B, T, K) tensor, got {shape_or_type(unary)}")
        B, T, K = unary.shape
    else:
        B, T, K = labels.shape[0], labels.shape[-1], num_labels
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point():
            raise TypeError("labels must be an integer tensor")
        want = 3 if unary is not None else 2
        if labels.dim() != want or labels.shape[0] != B or labels.shape[-1] < T:
            shape = f"({B}, C, >= {T})" if want == 3 else "(B, T)"
            raise ValueError(f"labels must have shape {shape}, got {tuple(labels.shape)}")
    if minus is not None and (not isinstance(minus, torch.Tensor) or minus.shape != labels.shape):
        raise ValueError(f"minus must have the shape of labels {tuple(labels.shape)}")
    if z is not None:
        tail = K * K + 2 * K
        if not isinstance(z, torch.Tensor) or z.dim() != 2 or z.shape[0] != B or z.shape[1] < T * K + tail \
                or (z.shape[1] - tail) % max(K, 1):
            raise ValueError(f"z must have shape ({B}, T' {K} + {tail}) with T' >= {T}, got {shape_or_type(z)}")
    if lengths is not None:
        if not isinstance(lengths, torch.Tensor) or lengths.shape != (B,) or lengths.is_floating_point():
            raise ValueError(f"lengths must be a ({B},) integer tensor")
        if values and lengths.device.type == "cpu" and B:
            lo, hi = (int(v) for v in torch.aminmax(lengths))
            if lo < 1 or hi > T:
                raise ValueError(f"lengths must be in [1, {T}], got a length of {lo if lo < 1 else hi}")
            if labels is not None and labels.device.type == "cpu" and labels.numel():
                for name, t in (("labels", labels),) + (() if minus is None else (("minus", minus),)):
                    if int(t.max()) < K:  # the common case, one reduction (the sequential solver calls this often)
                        continue
                    if not everywhere:
                        inside = torch.arange(t.shape[-1]).unsqueeze(0) < lengths.view(B, *([1] * (t.dim() - 1)))
                        t = t[inside.expand_as(t)]
                    if t.numel() and int(t.max()) >= K:
                        raise ValueError(f"{name} must be < {K}" + ("" if everywhere else " within each length"))


def _promoted(*tensors):
    """The float ``tensors`` (None kept) in their promoted dtype when they mix dtypes: the twins then compute and
    return one dtype (Triton promoted only some inputs, the torch twin others, numba refused)."""
    dtypes = {t.dtype for t in tensors if t is not None}
    if len(dtypes) <= 1:
        return tensors
    dt = functools.reduce(torch.promote_types, dtypes)
    return tuple(None if t is None else t.to(dt) for t in tensors)


@torch.no_grad()
def viterbi(unary, transition, start, end, lengths, backend: str = "auto", *, guard: bool = False):
    """Dispatch to `viterbi_torch`, `viterbi_triton` or `viterbi_numba` (bitwise equal); see `viterbi_torch` for
    the contract. Inputs are not checked here (the structures validate at the boundary). ``guard``: where Triton
    runs, guard the sums against overflow on the device (`guard_triton`, one launch more), for callers that did
    not read the potentials' magnitudes; the other forms run on the host's guard (`Structure._guarded`)."""
    be = resolve("viterbi", backend, unary.device, unary, transition, start, end)
    if be == "triton":
        from .viterbi_triton import viterbi_triton

        if guard:
            from .guard_triton import chain_guard_partials

            return viterbi_triton(unary, transition, start, end, lengths,
                                  guard=chain_guard_partials(unary, transition, start, end))
        return viterbi_triton(unary, transition, start, end, lengths)
    if be == "numba":
        from .viterbi_numba import viterbi_numba

        return viterbi_numba(unary, transition, start, end, lengths)
    return viterbi_torch(unary, transition, start, end, lengths)


@torch.no_grad()
def chain_labels_score(unary, transition, start, end, labels, lengths, backend: str = "auto", *, check: bool = True):
    """Scores ``(B, C)`` of ``labels (B, C, W)`` under chain potentials with shared transitions: dispatch to
    `chain_labels_score_torch`, `chain_labels_score_triton` (one launch instead of about fifteen) or
    `chain_labels_score_numba` (one compiled loop; equal to rounding; mixed dtypes are promoted first, so every twin
    returns the promoted dtype; ``"auto"`` keeps torch for the per-position
    transitions ``(B, T-1, K, K)`` that the torch twin also takes with one labelling per example). The arguments'
    shapes are checked, and on CPU the values of ``lengths`` and ``labels`` (`_check_chain_args`); ``check=False``
    skips that for callers that validated their data at the boundary (`ChainProblem`, in every solver step)."""
    unary, transition, start, end = _promoted(unary, transition, start, end)
    be = resolve("chain_labels_score", backend, unary.device, unary, transition, start, end)
    if be == "numba" and backend == "auto" and transition.dim() != 2:
        be = "torch"
    if check:
        _check_chain_args(unary, lengths=lengths, labels=labels, values=be != "numba")
    if be == "triton":
        from .chain_score_triton import chain_labels_score_triton

        return chain_labels_score_triton(unary, transition, start, end, labels, lengths)
    if be == "numba":
        from .chain_score_numba import chain_labels_score_numba

        return chain_labels_score_numba(unary, transition, start, end, labels, lengths)
    return chain_labels_score_torch(unary, transition, start, end, labels, lengths)


@torch.no_grad()
def chain_inner(unary, transition, start, end, z, backend: str = "auto", *, check: bool = True):
    """``<theta_b, z_b>`` ``(B,)`` of chain potentials and flat marginals ``z (B, m)``: dispatch to
    `chain_inner_torch`, `chain_inner_triton` (one launch instead of about nine) or `chain_inner_numba` (equal to
    rounding; mixed dtypes are promoted first, so every twin returns the promoted dtype). The shapes are checked
    (`_check_chain_args`; ``check=False``: not, as in `chain_labels_score`)."""
    if check:
        _check_chain_args(unary, z=z)
    unary, transition, start, end, z = _promoted(unary, transition, start, end, z)
    be = resolve("chain_inner", backend, unary.device, unary, transition, start, end, z)
    if be == "numba":
        from .chain_score_numba import chain_inner_numba

        return chain_inner_numba(unary, transition, start, end, z)
    if be == "triton":
        from .chain_score_triton import chain_inner_triton

        return chain_inner_triton(unary, transition, start, end, z)
    return chain_inner_torch(unary, transition, start, end, z)


@torch.no_grad()
def chain_marginals(labels, lengths, num_labels: int, minus=None, dtype=torch.float64, backend: str = "auto",
                    subtract=None, *, check: bool = True):
    """Flat one-hot marginals ``m(y)`` (or ``m(y) - m(y')``) of chain labellings: dispatch to
    `chain_marginals_torch`, `chain_marginals_triton` or `chain_marginals_numba` (bitwise equal; ``labels`` padded
    with -1 past ``lengths``). ``subtract``
    ``(B, m)`` of ``dtype``: the result minus it (the numba twin does it in the same pass; the FW direction of
    BCFW). The shapes are checked, and on CPU the values of ``lengths`` and ``labels`` (`_check_chain_args`;
    ``check=False``: not, as in `chain_labels_score`)."""
    if subtract is not None and subtract.dtype != dtype:
        raise ValueError(f"subtract must be of dtype {dtype}, got {subtract.dtype}")
    be = resolve("chain_marginals", backend, labels.device)
    if be == "numba" and backend == "auto" and dtype not in NUMBA_DTYPES:
        be = "torch"
    if check:
        _check_chain_args(None, lengths=lengths, labels=labels, num_labels=num_labels, minus=minus,
                          values=be != "numba", everywhere=True)
    if be == "numba":
        from .chain_marginals_numba import chain_marginals_numba

        return chain_marginals_numba(labels, lengths, num_labels, minus, dtype, subtract)
    if be == "triton":
        from .chain_marginals_triton import chain_marginals_triton

        out = chain_marginals_triton(labels, lengths, num_labels, minus, dtype)
    else:
        out = chain_marginals_torch(labels, lengths, num_labels, minus, dtype)
    return out if subtract is None else out - subtract


@torch.no_grad()
def slack_viterbi(unary, transition, start, end, lengths, target, cost, target_score, backend: str = "auto",
                  margin=1.0):
    """Dispatch to `slack_viterbi_torch` or `slack_viterbi_triton`; see `slack_viterbi_torch` for the
    contract (the exact slack-rescaled chain oracle; Choi et al., 2016)."""
    if resolve("slack_viterbi", backend, unary.device) == "triton":
        from .slack_chain_triton import slack_viterbi_triton

        return slack_viterbi_triton(unary, transition, start, end, lengths, target, cost, target_score, margin)
    return slack_viterbi_torch(unary, transition, start, end, lengths, target, cost, target_score, margin)
