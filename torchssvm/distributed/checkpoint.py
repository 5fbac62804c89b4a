"""Saving and resuming a distributed solver: one checkpoint file per rank and a manifest written by rank 0
(docs/distributed.md, "State and resume").

``folder/step{k}/rank{r}.ckpt`` holds rank r's `state_dict` after step k (`save_checkpoint`: written atomically,
with its digest); ``folder/manifest.json`` records the world size, the shard sizes, the files, every rank's data
fingerprint and the step. The manifest is written (atomically) once every rank's file is: it is the commit point,
so a run killed while saving leaves the previous manifest and the files it names. Resume on a process group of the
same world size over the same shards."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Union

from .._atomic import atomic_write_bytes
from ..optim.checkpoint import load_checkpoint, save_checkpoint

MANIFEST = "manifest.json"
FORMAT = "torchssvm-sharded-state"
VERSION = 1


def _rank_file(rank: int) -> str:
    return f"rank{rank}.ckpt"


def save_sharded(solver, folder: Union[str, os.PathLike]) -> Path:
    """Write ``solver``'s state (a `DistributedBCFW` or `DistributedFrankWolfe`) to ``folder``: every rank its
    file, then rank 0 the manifest naming them, then rank 0 removes the files of earlier saves (a collective;
    returns the manifest's path)."""
    sh = solver.shard
    folder = Path(folder)
    state = solver.state_dict()
    fingerprints = sh.comm.all_gather_object(state.get("fingerprint"))
    steps = sh.comm.all_gather_object(int(state.get("steps_done", 0)))
    if len(set(steps)) > 1:
        raise RuntimeError(f"save_sharded: the ranks are at different steps {steps}: every rank saves at one point")
    sub = f"step{steps[0]}"
    save_checkpoint(state, folder / sub / _rank_file(sh.rank))
    sh.comm.barrier()
    path = folder / MANIFEST
    if sh.rank == 0:
        manifest = {"format": FORMAT, "version": VERSION, "world_size": sh.world_size, "sizes": list(sh.sizes),
                    "n": sh.n, "files": [f"{sub}/{_rank_file(r)}" for r in range(sh.world_size)],
                    "fingerprints": fingerprints, "steps_done": steps[0], "solver": type(solver).__name__}
        atomic_write_bytes(path, (json.dumps(manifest, indent=1) + "\n").encode())
        for old in folder.glob("step*"):
            if old.is_dir() and old.name != sub:
                shutil.rmtree(old, ignore_errors=True)
    sh.comm.barrier()
    return path


def read_manifest(folder: Union[str, os.PathLike]) -> dict:
    """The manifest of ``folder`` (a ValueError naming the folder when it has none or it is not one)."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: no readable manifest of a sharded state ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path}: not a manifest of a sharded state (format {FORMAT!r}, version {VERSION})")
    return manifest


def load_sharded(solver, folder: Union[str, os.PathLike]) -> None:
    """Resume ``solver`` from `save_sharded`'s ``folder``: every rank reads the manifest and its own file and loads
    it (`load_state_dict`). A collective: a manifest of another world size or other shard sizes, a missing or
    corrupt file, or a file other than the one the manifest names is a ValueError naming it on its rank, and a
    ValueError on every other rank, before any rank loads anything."""
    sh = solver.shard
    state, error = None, None
    try:
        manifest = read_manifest(folder)
        if manifest["world_size"] != sh.world_size:
            raise ValueError(f"{folder}: the state was saved on a process group of world size "
                             f"{manifest['world_size']}; this one has {sh.world_size}: resume on the same world size")
        if list(manifest["sizes"]) != list(sh.sizes):
            raise ValueError(f"{folder}: the state was saved on shards of {manifest['sizes']} examples; these ranks "
                             f"hold {list(sh.sizes)}")
        state = load_checkpoint(Path(folder) / manifest["files"][sh.rank])
        if state.get("fingerprint") != manifest["fingerprints"][sh.rank]:
            raise ValueError(f"{folder}: rank {sh.rank}'s file is not the one the manifest names (its data "
                             "fingerprint differs)")
    except ValueError as e:  # CheckpointError too
        error = e
    solver._agree(error)
    solver.load_state_dict(state)
