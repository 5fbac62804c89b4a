"""The checks behind the solvers' `load_state_dict`.

A state is checked whole before anything is set, so a rejected state leaves the solver as it was. A state saved
under other settings of the objective (``lam``, the rescaling, the box, the number of examples) is rejected rather
than adopted: its blocks, cuts or bounds would certify an objective the solver is not minimizing. A state of another
data set with the same sizes is told apart by its fingerprint (`torchssvm.optim.fingerprint`), and a state whose
tensors disagree with each other by each solver's `_check_consistency` (`check_close` and `check_range` here).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .._validation import shape_or_type


def require_keys(state, keys: Sequence[str], name: str = "state_dict") -> None:
    if not isinstance(state, dict):
        raise TypeError(f"{name} must be a dict, got {type(state).__name__}")
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"{name} is missing {missing}")


def box_state(box: Optional[tuple]) -> Optional[torch.Tensor]:
    """A solver's box ``(lower, upper)`` as it is saved: ``(2, d)`` float64 on the CPU, or None."""
    return None if box is None else torch.stack(box).to("cpu", torch.float64)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        return torch.equal(a.to("cpu", torch.float64), b.to("cpu", torch.float64))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12)
    return a == b


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}" if value.numel() > 4 else str(value.tolist())
    return repr(value)


def check_config(state: dict, config: dict) -> None:
    """Each entry of ``config`` (this solver's value of a setting its state depends on) must equal the state's."""
    missing = [k for k in config if k not in state]
    if missing:
        raise ValueError(f"state_dict is missing {missing}: it was saved by another solver, or by a torchssvm that "
                         "did not record the settings a state is bound to")
    for name, mine in config.items():
        if not _same(state[name], mine):
            theirs = state[name]
            if (isinstance(theirs, torch.Tensor) and isinstance(mine, torch.Tensor) and theirs.shape == mine.shape
                    and mine.numel() > 4):
                raise ValueError(f"state_dict was saved with another {name}: a tensor of shape {tuple(mine.shape)} "
                                 "as this solver's, with other values")
            raise ValueError(f"state_dict was saved with {name} = {_show(theirs)}; this solver has {name} = "
                             f"{_show(mine)}")


def checked_tensor(state: dict, key: str, shape: Sequence[int], like: torch.Tensor,
                   name: str = "state_dict") -> torch.Tensor:
    """``state[key]`` as a copy on ``like``'s device, after checking it is a tensor of ``shape`` and of ``like``'s
    dtype (a state converted to a lower precision would certify with its rounding errors: refused, not converted)."""
    t = state[key]
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
        got = shape_or_type(t)
        raise ValueError(f"{name}[{key!r}] does not match this solver: it must be a tensor of shape {tuple(shape)}, "
                         f"got {got}")
    if t.dtype != like.dtype:
        raise ValueError(f"{name}[{key!r}] is {t.dtype}; this solver keeps it in {like.dtype}")
    check_not_nan(t, key, name)
    return t.to(like.device).clone()


def check_not_nan(t: torch.Tensor, key: str, name: str = "state_dict") -> None:
    """No state tensor may hold NaN (block gaps may hold +inf: a block not yet visited)."""
    if (t.is_floating_point() or t.is_complex()) and bool(torch.isnan(t).any()):
        raise ValueError(f"{name}[{key!r}] holds NaN: the state is corrupt")


def checked_generator_state(state: dict, key: str = "generator") -> torch.Tensor:
    """``state[key]``, a CPU ``torch.Generator`` state, after checking a generator takes it."""
    value = state[key]
    try:
        torch.Generator().set_state(value)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"state_dict[{key!r}] is not a torch.Generator state: {e}") from None
    return value


def checked_scalars(state: dict, types: dict, name: str = "state_dict") -> dict:
    """``{key: kind(state[key])}`` for ``types = {key: kind}`` (int, float or bool), a ValueError naming the key
    where a value does not convert."""
    out = {}
    for key, kind in types.items():
        try:
            out[key] = kind(state[key])
        except (TypeError, ValueError):
            raise ValueError(f"{name}[{key!r}] must be a {kind.__name__}, got {state[key]!r}") from None
        if kind is int and out[key] != state[key]:  # int(2.7) would load a count of 2
            raise ValueError(f"{name}[{key!r}] must be an int, got {state[key]!r}")
    return out


def check_close(key: str, saved: torch.Tensor, recomputed: torch.Tensor, scale: float, rtol: float = 1e-7,
                what: str = "", name: str = "state_dict") -> None:
    """``saved`` must equal ``recomputed`` to within ``rtol * scale`` entrywise (rounding of the incremental updates
    that built it), else a ValueError naming ``key`` and ``what`` it was recomputed from."""
    if saved.numel() == 0:
        return
    err = float((saved.to(recomputed.dtype) - recomputed).abs().max())
    if not err <= rtol * max(scale, 1e-300):  # NaN fails
        raise ValueError(f"{name}[{key!r}] disagrees with {what or 'the rest of the state'} by {err:.3g} (rounding "
                         f"allows {rtol * scale:.3g}): the state is corrupt or was edited")


# why a cut's age can lie past this solver's bound (the bundle methods and the kernel SVM drop cuts by age)
AGE_CAUSE = ("saved with a larger inactive_after (build the solver with the run's), or the state is corrupt or was "
             "edited")


def check_range(key: str, t: torch.Tensor, lower, upper, tol: float = 0.0, what: str = "",
                name: str = "state_dict", cause: str = "the state is corrupt or was edited") -> None:
    """Every entry of ``t`` in ``[lower - tol, upper + tol]`` (bounds are numbers or tensors of ``t``'s shape), else
    a ValueError naming ``key``, the worst entry, ``what`` the bound is and ``cause``."""
    if t.numel() == 0:
        return
    lo = torch.as_tensor(lower, dtype=t.dtype, device=t.device)
    up = torch.as_tensor(upper, dtype=t.dtype, device=t.device)
    below, above = (lo - tol - t).clamp_min(0), (t - up - tol).clamp_min(0)
    worst = torch.maximum(below, above)
    i = int(worst.reshape(-1).argmax())
    if float(worst.reshape(-1)[i]) > 0:
        raise ValueError(f"{name}[{key!r}] has entry {i} = {float(t.reshape(-1)[i]):.6g} outside "
                         f"[{float(lo.expand_as(t).reshape(-1)[i]):.6g}, {float(up.expand_as(t).reshape(-1)[i]):.6g}]"
                         f"{' (' + what + ')' if what else ''}: {cause}")
