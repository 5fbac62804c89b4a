"""The fingerprint of a training set: a SHA-256 digest of the tensors a solver's state is bound to.

A state's dual blocks, cuts or averaged iterates are of one data set: loaded on another of the same sizes (the same
words permuted, other words) they would certify an objective the solver is not minimizing, and a later gap would be
wrong. `Solver.state_dict` records the fingerprint and `Solver.load_state_dict` refuses a state whose fingerprint
differs. The digest covers each tensor's name, dtype, shape and bytes (the same on every device), in name order,
and the settings of the problem's structure (`settings`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def _update(h, name: str, value: Any) -> None:
    h.update(name.encode() + b"\0")
    if value is None:
        h.update(b"none\0")
    elif isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{t.dtype}{tuple(value.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, (tuple, list)):  # a namedtuple of tensors (TokenFeatures) or a list of them
        h.update(f"seq{len(value)}\0".encode())
        for i, item in enumerate(value):
            _update(h, f"{name}[{i}]", item)
    elif isinstance(value, (bool, int, float, str)):
        h.update(f"{type(value).__name__}:{value!r}\0".encode())
    else:
        raise TypeError(f"cannot fingerprint {name} of type {type(value).__name__}")


def fingerprint(named: dict) -> str:
    """The SHA-256 hex digest of ``named`` (``{name: tensor, tuple of tensors, number, str or None}``)."""
    h = hashlib.sha256()
    for name in sorted(named):
        _update(h, name, named[name])
    return h.hexdigest()


def _plain(value: Any) -> bool:
    """Whether `fingerprint` takes ``value`` as it is: a tensor, a number, a string, None, or a tuple / list of them."""
    if value is None or isinstance(value, (torch.Tensor, bool, int, float, str)):
        return True
    return isinstance(value, (tuple, list)) and all(_plain(v) for v in value)


def settings(obj) -> dict:
    """The public attributes of ``obj`` that `fingerprint` takes (tensors, numbers, strings, None and tuples of
    them): a structure's edges, loss, normalization and class weights, which decide the objective as much as the
    data do (two edge sets of one size give the same shapes)."""
    return {name: value for name, value in vars(obj).items() if not name.startswith("_") and _plain(value)}


def tensor_attributes(obj, exclude: tuple = ()) -> dict:
    """The public attributes of ``obj`` that are tensors or tuples of tensors (its data), but ``exclude``."""
    out = {}
    for name, value in vars(obj).items():
        if name.startswith("_") or name in exclude:
            continue
        if isinstance(value, torch.Tensor) or (isinstance(value, tuple) and value
                                               and all(isinstance(v, torch.Tensor) or v is None for v in value)):
            out[name] = value
    return out
