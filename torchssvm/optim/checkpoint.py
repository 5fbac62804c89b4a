"""Checkpoint files: a solver's `state_dict`, written atomically, with a digest checked when it is read.

A file is one header line and the payload::

    TORCHSSVM-CHECKPOINT 1 sha256=<64 hex digits> bytes=<payload length>\\n
    <payload: the state, serialized by torch.save>

`save_checkpoint` writes it through `torchssvm._atomic.atomic_write` (a temporary file in the same folder, flushed
and synced, then renamed): a process killed while writing leaves the previous checkpoint whole. `load_checkpoint`
refuses a file whose length or digest disagrees with its header (a copy cut short, a flipped byte) and reads the
payload with ``torch.load(weights_only=True)``: tensors, numbers, strings and containers only, never code. The
state read is then checked by the solver's `load_state_dict` (shapes, settings, the data's fingerprint and the
identities between its tensors) before it is adopted.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Union

import torch

from .._atomic import atomic_write

MAGIC = b"TORCHSSVM-CHECKPOINT"
VERSION = 1
_HEADER = re.compile(rb"TORCHSSVM-CHECKPOINT (\d+) sha256=([0-9a-f]{64}) bytes=(\d+)\n")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read back as written (not a checkpoint, cut short, corrupted); the message
    starts with the file's path."""


def save_checkpoint(state: dict, path: Union[str, os.PathLike]) -> Path:
    """Write ``state`` (a solver's `state_dict`) to ``path`` atomically, with its digest. Returns the path."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = b"%s %d sha256=%s bytes=%d\n" % (MAGIC, VERSION, hashlib.sha256(payload).hexdigest().encode(),
                                               len(payload))

    def write(f):
        f.write(header)
        f.write(payload)

    return atomic_write(path, write)


def resume_from(solver, path, every: int = 1) -> None:
    """Check the arguments of ``fit(checkpoint=path, checkpoint_every=every)`` and, when the file ``path`` exists,
    load its state into ``solver`` (`load_checkpoint`, then ``solver.load_state_dict``: a state of other data or
    settings is refused, naming why)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a path (str or os.PathLike), got {type(path).__name__}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1 (steps), got {every!r}")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint must be a file path, got the folder {os.fspath(path)!r}")
    if os.path.exists(path):
        solver.load_state_dict(load_checkpoint(path))


def load_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """The state saved in ``path`` by `save_checkpoint`, after checking its header, length and digest (a
    `CheckpointError` naming the file and what is wrong otherwise). Tensors are loaded on the CPU."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from e
    end = data.find(b"\n", 0, 200)
    match = _HEADER.fullmatch(data[: end + 1]) if end >= 0 else None
    if match is None:
        what = "is empty" if not data else "does not start with a torchssvm checkpoint header"
        raise CheckpointError(f"{path}: {what}; it was not written by save_checkpoint / fit(checkpoint=...)")
    version, digest, length = int(match[1]), match[2].decode(), int(match[3])
    if version != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version}; this torchssvm reads version {VERSION}")
    payload = data[end + 1:]
    if len(payload) != length:
        raise CheckpointError(f"{path}: holds {len(payload)} bytes of state where its header says {length}: the file "
                              "was cut short or appended to")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{path}: the state's SHA-256 digest disagrees with the header's: the file is corrupted")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # a payload whose digest matches but torch cannot read (another torch's format)
        raise CheckpointError(f"{path}: the state cannot be read by this torch ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a solver's state_dict")
    return state
