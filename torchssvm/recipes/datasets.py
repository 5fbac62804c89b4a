"""The (train, test) datasets of the recipes by name: the ``--data`` choices of the command line."""

from __future__ import annotations

from typing import Optional

from .. import data

DATASETS = ("synthetic", "ocr-large", "ocr-small", "conll2000-chunk", "pose")


def load_datasets(name: str, root: Optional[str] = None, seed: int = 0, min_count: int = 1, *,
                  num_train: Optional[int] = None, num_test: Optional[int] = None, grid: int = 12,
                  limb_modes: int = 1, download: bool = False):
    """(train, test) for a name of `DATASETS`: `SequenceDataset`s, or `PoseDataset`s for ``"pose"``.

    Args:
        name: ``"synthetic"`` (seeded chains: 1,000 / 300 sequences, 6 labels, 20 features), ``"ocr-large"`` /
            ``"ocr-small"`` (the OCR words of Taskar et al. 2003: training on folds 1-9 or on fold 0),
            ``"conll2000-chunk"`` (CoNLL-2000 chunking, sparse attributes) or ``"pose"`` (seeded pictorial
            structures, `data.synthetic_pose`).
        root: folder of the real data sets (default: ``$TORCHSSVM_DATA`` or the download cache).
        seed: seed of the synthetic data.
        min_count: CoNLL: keep the attributes seen at least this often in training.
        num_train, num_test: pose: examples per split (default 16 each).
        grid: pose: the board is ``grid x grid`` positions.
        limb_modes: pose: limbs bent in this many modes.
        download: the real data sets: fetch the files missing from ``root`` (`data.ocr`, `data.conll2000`).
    """
    if name == "synthetic":
        kw = {"num_labels": 6, "num_features": 20, "noise": 1.0, "seed": seed}
        return data.synthetic_chain("train", 1000, **kw), data.synthetic_chain("test", 300, **kw)
    if name.startswith("ocr-"):
        variant = name.split("-", 1)[1]
        return (data.ocr("train", variant, root=root, download=download),
                data.ocr("test", variant, root=root, download=download))
    if name == "pose":
        kw = {"height": grid, "width": grid, "limb_modes": limb_modes, "seed": seed}
        return (data.synthetic_pose("train", 16 if num_train is None else num_train, **kw),
                data.synthetic_pose("test", 16 if num_test is None else num_test, **kw))
    if name == "conll2000-chunk":
        return (data.conll2000("train", "chunk", root=root, min_count=min_count, download=download),
                data.conll2000("test", "chunk", root=root, min_count=min_count, download=download))
    raise ValueError(f"--data must be one of {DATASETS}, got {name!r}")
