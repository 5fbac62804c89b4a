"""Linear potential models: potentials linear in the parameters ``w``.

For such a model the joint feature map is the vector-Jacobian product of the model (docs/design.md,
"Dual blocks in marginal space"):
``phi(x, mu) = d <model(x), mu> / d w``, so ``<w, phi(x, y)> = score(model(x), y)`` and no structure
hand-codes ``phi``. `joint_feature` computes it for any model, linear or not (for a non-linear model it
is the gradient of the score, the quantity a deep SSVM step uses).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._validation import check_bool, check_float_dtype, check_positive_int, check_tensor
from .data.token_features import TokenFeatures, check_token_features
from .structures.chain import ChainPotentials

CHAIN_BIASES = ("ocr", "global", None)


def _param_dtype(dtype) -> Optional[torch.dtype]:
    """The parameters' ``dtype``: None (torch's default) or a floating-point ``torch.dtype``, else a TypeError naming
    ``dtype`` (an integer dtype failed deep inside ``nn.Parameter``: "Only Tensors of floating point ... can require
    gradients")."""
    return None if dtype is None else check_float_dtype(dtype, "dtype")


def _device(device):
    """``device`` as torch takes it (None, a string, an int or a ``torch.device``), else a TypeError / ValueError
    naming ``device``."""
    if device is None:
        return None
    try:
        return torch.device(device)
    except (TypeError, RuntimeError, ValueError) as e:
        if isinstance(device, (str, int)):
            raise ValueError(f"device: {e}") from None
        raise TypeError(f"device must be a torch.device, a device string or an index, got {device!r}") from None


class LinearChainModel(nn.Module):
    """Chain potentials linear in ``w = (emission, transition, biases)``.

    ``unary[b, t, k] = <x[b, t], emission[:, k]> + bias[k]``, ``transition (K, K)``, and with
    ``bias="ocr"`` the first / last position biases of the OCR model of Taskar et al. used by the BCFW
    papers (``start``, ``end``): ``d = D K + K^2 + 3K`` (4,082 for OCR's D=128, K=26).

    Args:
        num_features: D, the token feature dimension (or the number of sparse attributes).
        num_labels: K.
        bias: ``"ocr"`` (global + first + last), ``"global"``, or None.
        sparse: inputs are `TokenFeatures` rather than dense ``(B, T, D)`` tensors.

    Parameters start at zero (``w = 0``, the dual solvers' starting point).
    """

    def __init__(self, num_features: int, num_labels: int, *, bias: Optional[str] = "ocr", sparse: bool = False,
                 dtype: Optional[torch.dtype] = None, device=None):
        super().__init__()
        D = check_positive_int("num_features", num_features)
        K = check_positive_int("num_labels", num_labels)
        if not (bias is None or isinstance(bias, str)) or bias not in CHAIN_BIASES:
            raise ValueError(f"bias must be one of {CHAIN_BIASES}, got {bias!r}")
        kw = {"dtype": _param_dtype(dtype), "device": _device(device)}
        self.num_features, self.num_labels, self.bias_mode = D, K, bias
        self.sparse = check_bool("sparse", sparse)
        self.emission = nn.Parameter(torch.zeros(D, K, **kw))
        self.transition = nn.Parameter(torch.zeros(K, K, **kw))
        self.bias = nn.Parameter(torch.zeros(K, **kw)) if bias is not None else None
        self.start = nn.Parameter(torch.zeros(K, **kw)) if bias == "ocr" else None
        self.end = nn.Parameter(torch.zeros(K, **kw)) if bias == "ocr" else None

    def unary(self, x) -> torch.Tensor:
        """``(B, T, K)`` unary potentials of dense ``(B, T, D)`` or `TokenFeatures` inputs."""
        D = self.num_features
        if self.sparse:
            if not isinstance(x, TokenFeatures):
                raise TypeError(f"x must be TokenFeatures for a sparse model, got {type(x).__name__}")
            check_token_features("x", x, D, device=self.emission.device)
            B, T, A = x.ids.shape
            ids = x.ids.reshape(B * T, A).long()  # embedding_bag takes int32 / int64 ids only
            if A == 0:
                u = self.emission.new_zeros(B, T, self.num_labels)
                return u + self.bias if self.bias is not None else u
            weights = (ids >= 0).to(self.emission.dtype)
            if x.values is not None:
                weights = torch.where(ids >= 0, x.values.reshape(B * T, A).to(self.emission.dtype), 0.0)
            u = F.embedding_bag(ids.clamp_min(0), self.emission, per_sample_weights=weights, mode="sum")
            u = u.view(B, T, self.num_labels)
        else:
            if isinstance(x, TokenFeatures):
                raise TypeError("x is TokenFeatures but the model is dense (construct it with sparse=True)")
            check_tensor("x", x, ndim=3, floating=True, device=self.emission.device)
            if x.shape[2] != D:
                raise ValueError(f"x must have {D} features in its last dimension, got shape {tuple(x.shape)}")
            u = x.to(self.emission.dtype) @ self.emission
        if self.bias is not None:
            u = u + self.bias
        return u

    def forward(self, x) -> ChainPotentials:
        return ChainPotentials(self.unary(x), self.transition, self.start, self.end)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, num_labels={self.num_labels}, bias={self.bias_mode!r}, " \
               f"sparse={self.sparse}"


class LinearMulticlassModel(nn.Module):
    """Multiclass scores ``x @ weight + bias``: ``(B, D) -> (B, K)``; ``d = D K (+ K)``; starts at zero."""

    def __init__(self, num_features: int, num_classes: int, *, bias: bool = True,
                 dtype: Optional[torch.dtype] = None, device=None):
        super().__init__()
        D = check_positive_int("num_features", num_features)
        K = check_positive_int("num_classes", num_classes)
        bias = check_bool("bias", bias)
        kw = {"dtype": _param_dtype(dtype), "device": _device(device)}
        self.num_features, self.num_classes = D, K
        self.weight = nn.Parameter(torch.zeros(D, K, **kw))
        self.bias = nn.Parameter(torch.zeros(K, **kw)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, ndim=2, floating=True, device=self.weight.device, dense=False)  # sparse x: as is
        if x.shape[1] != self.num_features:
            raise ValueError(f"x must have {self.num_features} features, got shape {tuple(x.shape)}")
        s = x.to(self.weight.dtype) @ self.weight
        return s + self.bias if self.bias is not None else s


def _as_tuple(potentials):
    return (potentials,) if isinstance(potentials, torch.Tensor) else tuple(potentials)


def joint_feature(model: nn.Module, x, marginals, *, per_example: bool = False) -> torch.Tensor:
    """``phi(x, mu) = d <model(x), mu> / d w`` flattened in ``model.parameters()`` order (the parameters that
    require grad: a frozen one is not part of ``w``).

    Args:
        model: maps ``x`` to potentials (a tensor or a tuple such as `ChainPotentials`).
        x: a batch of inputs.
        marginals: per-example marginals of the same structure (e.g. ``Chain.marginals(y)``); a potential
            tensor without a batch dimension (a shared transition) is paired with the per-example
            marginals summed over the batch.
        per_example: return ``(B, d)`` (one row per example) instead of the batch sum ``(d,)``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    per_example = check_bool("per_example", per_example)
    params = [p for p in model.parameters() if p.requires_grad]
    if per_example:
        mus = _as_tuple(marginals)
        B = mus[0].shape[0]
        n_x = x.shape[0] if hasattr(x, "shape") else len(x)  # TokenFeatures: len is the NamedTuple's
        if n_x != B:  # each row of x goes with a row of the marginals
            raise ValueError(f"x holds {n_x} examples but marginals {B}")
        rows = []
        for b in range(B):
            xb = x[b : b + 1]
            if isinstance(marginals, torch.Tensor):
                mb = marginals[b : b + 1]
            else:
                parts = [None if m is None else m[b : b + 1] for m in mus]
                mb = type(marginals)(*parts) if hasattr(marginals, "_fields") else tuple(parts)  # NamedTuple or not
            rows.append(joint_feature(model, xb, mb))
        if rows:
            return torch.stack(rows)
        ref = params[0] if params else None
        return torch.zeros(0, sum(p.numel() for p in params), dtype=None if ref is None else ref.dtype,
                           device=None if ref is None else ref.device)
    with torch.enable_grad():
        pots = _as_tuple(model(x))
        mus = _as_tuple(marginals)
        if len(pots) != len(mus):
            raise ValueError(f"marginals has {len(mus)} parts but the model's potentials have {len(pots)}")
        total = None
        for i, (p, m) in enumerate(zip(pots, mus)):
            if p is None:
                continue
            if m is None:  # phi would silently miss this factor's features, and <w, phi> the score
                name = marginals._fields[i] if hasattr(marginals, "_fields") else f"part {i}"
                raise ValueError(f"marginals.{name} is None but the model has that potential (pass its marginals)")
            if p.dim() == m.dim() - 1:  # shared factor: pair with the batch sum
                m = m.sum(0)
            if p.shape != m.shape:
                raise ValueError(f"marginals part of shape {tuple(m.shape)} does not match potentials "
                                 f"{tuple(p.shape)}")
            term = (p * m.to(p.dtype)).sum()
            total = term if total is None else total + term
        grads = torch.autograd.grad(total, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])
