"""Input checks at the library boundary: every error names the argument and what was expected."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from typing import Optional

import numpy as np
import torch

# -- debug mode: the value checks of device tensors -------------------------------------------------------------
# Checking a value (a label < K, a length <= T, a finite potential) makes the host read it back: on a GPU that is
# a wait for every kernel queued before it, per call. Checks of device tensors therefore look at metadata only
# (shapes, dtypes, devices) unless debug mode is on; CPU tensors are always checked in full.
_debug = os.environ.get("TORCHSSVM_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def set_debug(enabled: bool = True) -> bool:
    """Turn debug mode on or off; returns the previous setting (``prev = set_debug(True); ...; set_debug(prev)``).
    ``TORCHSSVM_DEBUG=1`` in the environment turns it on at import.

    In debug mode the value checks of a `Chain`'s arguments (finite potentials, lengths in ``[1, T]``, labels in
    ``[0, K)`` within each length) and of a ``loss_weight`` tensor (finite, ``>= 0``) run on device (CUDA) tensors
    too, as they always do on the CPU, and raise the same ValueError, at the cost of a few host waits per call.
    Outside debug mode a device call does not read these values (each read makes the host wait for the device):
    a chain's lengths are clamped to ``[1, T]`` before a kernel indexes with them, torch's indexing asserts on the
    device on a label out of range, and the chain hinge's fused Triton kernels clamp what they index and make the
    loss of an example with a bad label, length or loss weight NaN. (The other structures' checks still read.)

    The same read gives the potentials' largest magnitudes to the overflow guard (`torchssvm.structures.base`,
    "numerics at the dtype's limits"): in debug mode a device `Chain` is guarded as on the CPU (float64 sums where
    float32 ones could overflow, or an OverflowError). Outside it the Triton hinge and `max_oracle` / `decode` guard
    themselves inside their kernels (`torchssvm.kernels.chain.guard_triton`), and a device `Chain`'s other calls
    take a power of two found on the device (`torchssvm.structures.base.device_scaling`): +-inf where a result does
    not fit, never NaN."""
    global _debug
    previous, _debug = _debug, bool(enabled)
    return previous


def debug_enabled() -> bool:
    """Whether debug mode is on (`set_debug`)."""
    return _debug


def reads_values(device) -> bool:
    """Whether argument checks read the values of tensors on ``device``: always on the CPU, on another device
    only in debug mode (`set_debug`)."""
    return _debug or torch.device(device).type == "cpu"


def check_tensor(
    name: str,
    t,
    *,
    ndim: Optional[int] = None,
    floating: bool = False,
    integer: bool = False,
    device: Optional[torch.device] = None,
    dtype: Optional[torch.dtype] = None,
    dense: bool = True,
) -> torch.Tensor:
    """``t`` after checking it is a tensor of ``ndim`` dimensions, floating or integer, on ``device``, of ``dtype``
    and (``dense``) of the strided layout: the checks and kernels read dense memory, and a sparse tensor would fail
    inside them (``t.to_dense()`` makes one). ``dense=False`` where a sparse tensor is used as is (a linear model's
    bag-of-words ``x``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dense and t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {t.layout}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if integer and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but the other inputs have dtype {dtype}")
    return t


def check_shape(name: str, t: torch.Tensor, shape: tuple, what: str = "") -> None:
    if tuple(t.shape) != tuple(shape):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(shape)}{extra}, got {tuple(t.shape)}")


def check_square_sums(name: str, x: torch.Tensor, *, dtype: torch.dtype = torch.float64, factor: float = 4.0,
                      dim: int = -1) -> None:
    """Raise a ValueError naming ``name`` when ``factor`` times the largest sum of squares of ``x`` along ``dim``
    (the squared norm of a feature vector) does not fit ``dtype``, the dtype its products are computed in: finite
    features near the square root of the dtype's largest value give inner products of inf, and from them NaN kernel
    values or step sizes of 0. ``factor`` bounds how much larger a joint feature's squared norm can be (a difference
    of two feature vectors: 4; a chain's sum over T positions: 4 T^2). Reads ``x`` once (a data set's check); no copy
    unless the largest entry is within ``x.shape[dim]`` of the bound."""
    if not x.numel():
        return
    top = float(_abs_max(x))
    if top == 0.0 or not math.isfinite(top):
        return
    limit = math.log(torch.finfo(dtype).max) - math.log(factor)
    if 2 * math.log(top) + math.log(x.shape[dim]) <= limit:  # every row's sum of squares fits: nothing to compute
        return
    biggest = max(float((part.to(torch.float64) / top).square().sum(dim).max())  # chunks of rows: no full copy
                  for part in x.detach().reshape(-1, x.shape[dim]).split(1 << 16))
    if 2 * math.log(top) + math.log(biggest) > limit:
        raise ValueError(f"{name}: its squared norms overflow {str(dtype).replace('torch.', '')} (largest entry "
                         f"{top:.3g}): inner products of its rows are inf; rescale it (e.g. by its largest entry or "
                         "a StandardScaler)")


# what a structure's error about an infinite potential adds: -inf is the habit of masking in log space
POTENTIAL_INF_HINT = ("potentials must be finite, padding included (the oracles bound their sums by the largest "
                      "magnitude); to forbid a label, a transition or a state, give it a large negative finite "
                      "score, such as -1e4, not -inf")


def check_finite(named: dict, inf_hint: str = "") -> dict:
    """Raise if any tensor holds NaN or Inf (a ValueError naming it, with ``inf_hint`` after an Inf); return ``{name:
    max |entry|}`` (a float, 0.0 for an empty tensor). One device sync for all of them: the largest magnitudes come
    with the same read (`collect_magnitudes` hands them to the overflow guard of `torchssvm.structures.base`)."""
    tensors = [(k, v) for k, v in named.items() if v is not None]
    if not tensors:
        return {}
    flags = torch.stack([_abs_max(v) for _, v in tensors]).cpu()
    out = {}
    for (k, _), m in zip(tensors, flags.tolist()):
        if math.isnan(m):
            raise ValueError(f"{k} contains NaN")
        if math.isinf(m):
            raise ValueError(f"{k} contains Inf" + (f": {inf_hint}" if inf_hint else ""))
        out[k] = m
    if _collectors:
        _collectors[-1].update(out)
    return out


def _abs_max(t: torch.Tensor) -> torch.Tensor:
    """``max |t|`` as a float64 scalar (NaN if ``t`` holds one, inf if it holds one): no copy of ``t``."""
    if not t.numel():
        return torch.zeros((), dtype=torch.float64, device=t.device)
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if t.is_complex():
        return t.abs().amax().to(torch.float64)
    lo, hi = torch.aminmax(t)
    return torch.maximum(-lo.to(torch.float64), hi.to(torch.float64))


_collectors: list = []


@contextlib.contextmanager
def collect_magnitudes():
    """``with collect_magnitudes() as mags:`` every `check_finite` inside the block adds its ``{name: max |entry|}``
    to the dict ``mags``. A structure's ``validate`` checks its potentials with `check_finite` (on CPU tensors, and on
    device tensors in debug mode), so that the callers learn the magnitudes that bound the scores without a second
    read. Empty where nothing was read (device tensors outside debug mode)."""
    mags: dict = {}
    _collectors.append(mags)
    try:
        yield mags
    finally:
        _collectors.remove(mags)


def check_fits(what: str, value: torch.Tensor, dtype: torch.dtype, hint: str = "pass float64 potentials",
               shift: int = 0) -> None:
    """Raise an OverflowError unless every entry of ``value * 2**shift`` (``value`` computed in a wider dtype, or
    scaled down by ``2**-shift``) fits ``dtype``: the result would otherwise become inf when cast down. Reads
    ``value`` (callers only call it where they read values: `reads_values`)."""
    if not value.numel() or not value.is_floating_point():
        return
    big = float(_abs_max(value))
    limit = torch.finfo(dtype).max
    if not big <= math.ldexp(limit, -shift):
        flat = value.detach().reshape(-1).abs()
        i = int(torch.nan_to_num(flat, nan=math.inf).argmax())
        where = f" of example {i}" if value.dim() == 1 else ""
        x = float(value.detach().reshape(-1)[i])
        shown = f"{x:.3e}" if not shift else f"{x:.3e} * 2**{shift}"
        if dtype == torch.float64:
            hint = "rescale the potentials"
        raise OverflowError(f"{what}{where} is {shown}, beyond {_dtype_name(dtype)}'s range (|x| <= {limit:.3e}); "
                            f"{hint}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_or_type(x) -> object:
    """What an error message says a bad argument was: a tensor's shape tuple, else its type's name."""
    return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def check_lengths(lengths, batch: int, max_len: int, device: torch.device, *, values: bool = True) -> torch.Tensor:
    """Validate `lengths (B,)`, integer, 1 <= lengths <= max_len; None means all max_len. ``values=False``: the
    metadata only (the range is not read)."""
    if lengths is None:
        return torch.full((batch,), max_len, dtype=torch.long, device=device)
    check_tensor("lengths", lengths, ndim=1, integer=True, device=device)
    if lengths.shape[0] != batch:
        raise ValueError(f"lengths has {lengths.shape[0]} entries but the batch size is {batch}")
    if batch and values:
        lo, hi = torch.stack([lengths.min(), lengths.max()]).tolist()  # one device sync
        if lo < 1:
            raise ValueError(f"lengths must be >= 1, got a length of {lo}")
        if hi > max_len:
            raise ValueError(f"lengths must be <= the padded size {max_len}, got a length of {hi}")
    return lengths.long()


def binary_labels(y, num_labels: int):
    """``y`` as long where it is a bool tensor of a two-label structure (False 0, True 1); else as it is."""
    if num_labels == 2 and isinstance(y, torch.Tensor) and y.dtype == torch.bool:
        return y.long()
    return y


def check_labels(name: str, y, shape: tuple, num_labels: int, device, valid=None) -> torch.Tensor:
    """Labels must be integer, of `shape`, in [0, num_labels) where `valid` (a bool mask) is True.

    Returned as long, with every position outside ``valid`` set to -1 (whatever padding it held). With two labels
    (multi-label and hierarchy indicators, binary chains) a bool tensor is a labelling too: False 0, True 1."""
    y = binary_labels(y, num_labels)
    check_tensor(name, y, integer=True, device=device)
    check_shape(name, y, shape)
    yv = y if valid is None else torch.where(valid, y, torch.zeros((), dtype=y.dtype, device=y.device))
    if yv.numel():
        lo, hi = torch.stack([yv.min(), yv.max()]).tolist()  # one device sync
        if lo < 0 or hi >= num_labels:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds label {bad}, outside [0, {num_labels})")
    y = y.long()
    return y if valid is None else torch.where(valid, y, torch.full((), -1, dtype=torch.long, device=y.device))


def check_loss_weight_value(loss_weight) -> None:
    """What `check_loss_weight` can check without a batch, with no tensor built and no device read: a number
    finite and ``>= 0``, or a float tensor of at most one dimension."""
    if isinstance(loss_weight, torch.Tensor):
        if not loss_weight.is_floating_point() or loss_weight.dim() > 1:
            raise ValueError(f"loss_weight must be a scalar or a (B,) float tensor, got shape "
                             f"{tuple(loss_weight.shape)} and dtype {loss_weight.dtype}")
    elif isinstance(loss_weight, numbers.Real) and not isinstance(loss_weight, bool):
        if not (loss_weight >= 0 and loss_weight < float("inf")):
            raise ValueError(f"loss_weight must be finite and >= 0, got {loss_weight}")
    else:
        raise TypeError(f"loss_weight must be a number or a tensor, got {type(loss_weight).__name__}")


def check_loss_weight(loss_weight, batch: int, device, dtype) -> torch.Tensor:
    """A scalar or a `(B,)` tensor of non-negative finite weights; returned as `(B,)` of `dtype`. The values of a
    device tensor are read only in debug mode (`reads_values`)."""
    if not isinstance(loss_weight, torch.Tensor):
        check_loss_weight_value(loss_weight)  # a number, finite and >= 0
        return torch.full((batch,), float(loss_weight), dtype=dtype, device=device)
    if loss_weight.dim() == 0:
        loss_weight = loss_weight.expand(batch)
    if loss_weight.dim() != 1 or loss_weight.shape[0] != batch:
        raise ValueError(f"loss_weight must be a scalar or have shape ({batch},), got {tuple(loss_weight.shape)}")
    if loss_weight.device != device:
        raise ValueError(f"loss_weight is on {loss_weight.device} but the other inputs are on {device}")
    if not loss_weight.is_floating_point():
        raise TypeError(f"loss_weight must be a floating-point tensor, got dtype {loss_weight.dtype}")
    if batch and reads_values(loss_weight.device) and not (bool(torch.isfinite(loss_weight).all())
                                                          and bool((loss_weight >= 0).all())):
        raise ValueError("loss_weight must be finite and >= 0")
    return loss_weight.to(dtype)


def check_positive_int(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def check_bool(name: str, v) -> bool:
    """``v`` if it is a bool (Python's or numpy's), else a TypeError naming ``name`` (``bool("False")`` is True)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {v!r}")
    return bool(v)


def check_float_dtype(dtype, name: str = "dtype") -> torch.dtype:
    """``dtype`` if it is a floating-point ``torch.dtype``, else a TypeError naming ``name``."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


# Seeds of the data generators: their streams are seeded with ``seed * 1000 + k`` (`torchssvm.data.streams`), which
# must stay a 64-bit int.
MAX_SEED = 2**32 - 1


def check_seed(seed, name: str = "seed") -> int:
    """``seed`` as an int in ``[0, MAX_SEED]``, or a TypeError / ValueError naming ``name``."""
    seed = check_positive_int(name, seed, minimum=0)
    if seed > MAX_SEED:
        raise ValueError(f"{name} must be <= {MAX_SEED}, got {seed}")
    return seed


def check_int_sequence(name: str, values) -> tuple:
    """``values`` (a sequence of ints or a 1-D integer tensor) as a tuple of Python ints, or a TypeError naming
    ``name``: a float such as 0.5 or 1.7 is refused, not truncated."""
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer sequence, got a tensor of shape {tuple(values.shape)} "
                            f"and dtype {values.dtype}")
        return tuple(values.tolist())
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    out = tuple(values)
    for i, v in enumerate(out):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}[{i}] must be an int, got {v!r}")
    return tuple(int(v) for v in out)


def check_positive_float(name: str, v) -> float:
    """``v`` as a float, or a TypeError / ValueError naming ``name`` unless it is a positive finite number."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a positive number, got {v!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a positive finite number, got {v}")
    return v


def check_real(name: str, value, *, minimum: float = 0.0, maximum: float = math.inf) -> float:
    """``value`` as a float, or a TypeError / ValueError naming ``name`` unless it is a finite number in
    ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and minimum <= value <= maximum):
        raise ValueError(f"{name} must be finite and in [{minimum}, {maximum}], got {value}")
    return value


def refuse_vmap(what: str, *inputs) -> None:
    """A clear NotImplementedError naming ``what`` under ``torch.func.vmap``: the boundary checks and the oracles read
    values on the host, which a batched tensor cannot give (it failed with "Cannot access data pointer")."""
    is_batched = getattr(torch._C._functorch, "is_batchedtensor", None)
    if is_batched is not None and any(is_batched(t) for t in _tensor_leaves(inputs)):
        raise NotImplementedError(f"{what} do not support torch.func.vmap (their oracles and checks read values on "
                                  "the host); they are batched over the first dimension already")


def _tensor_leaves(x):
    """The tensors in ``x`` (nested tuples, lists and dicts): `pytree.tree_leaves` without its per-call cost (a
    noticeable part of the hinge's fixed cost on a GPU)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _tensor_leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensor_leaves(v)


def check_constant(name: str, t, why: str) -> None:
    """A ValueError where ``t`` requires grad (with autograd on): a tensor the score treats as a constant would get no
    gradient, silently; ``why`` says what it is. ``.detach()`` it to mean the constant."""
    if isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, but {why}: it would receive no gradient; pass {name}.detach()")
