"""Loaders against the documented sizes; metrics against hand-computed values."""

import gzip

import numpy as np
import pytest
import torch

import torchssvm as ts
from torchssvm.data.ocr import parse_letter_data
from torchssvm.metrics import chunk_f1, chunks


def test_ocr_sizes(data_root):
    sizes = {}
    for variant in ("large", "small"):
        for split in ("train", "test"):
            ds = ts.data.ocr(split, variant, root=data_root)
            sizes[variant, split] = (len(ds), ds.num_tokens)
            assert ds.num_labels == 26 and ds.num_features == 128 and ds.x.shape[1] == 14
            assert int(ds.lengths.min()) >= 3 and int(ds.lengths.max()) <= 14
            valid = torch.arange(14) < ds.lengths[:, None]
            assert bool((ds.y[valid] >= 0).all()) and bool((ds.y[~valid] == -1).all())
            assert set(ds.x.unique().tolist()) <= {0.0, 1.0}
    assert sizes["large", "train"][0] == 6251 and sizes["large", "test"][0] == 626
    assert sizes["small", "train"] == sizes["large", "test"]
    assert sizes["large", "train"][1] + sizes["large", "test"][1] == 52152


def test_ocr_letter_data_parser(tmp_path):
    """Taskar's text format (the download source) parses to the npz arrays."""
    rng = np.random.default_rng(0)
    rows, words = [], [("cat", 3), ("ox", 0)]
    idx = 1
    for w, (word, fold) in enumerate(words):
        for p, ch in enumerate(word):
            nxt = -1 if p == len(word) - 1 else idx + 1
            px = rng.integers(0, 2, 128)
            rows.append("\t".join(map(str, [idx, ch, nxt, w + 1, p + 1, fold, *px])))
            idx += 1
    path = tmp_path / "letter.data.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    a = parse_letter_data(path)
    assert a["lengths"].tolist() == [3, 2] and a["folds"].tolist() == [3, 0]
    assert a["labels"].tolist() == [2, 0, 19, 14, 23] and a["pixels"].shape == (5, 128)


def test_conll2000_sizes_and_attributes(data_root):
    train = ts.data.conll2000("train", root=data_root)
    test = ts.data.conll2000("test", root=data_root)
    assert len(train) == 8936 and len(test) == 2012
    assert train.num_tokens == 211727 and test.num_tokens == 47377
    assert train.num_labels == 22 and test.label_names == train.label_names
    assert train.num_features == 335674 == test.num_features  # documented in conll2000.py
    assert ts.data.conll2000("train", root=data_root, min_count=3).num_features == 75289
    ids = train.x.ids
    assert int(ids.max()) < train.num_features and ids.shape[2] == 19
    # every real token has at least its 1 + 1 unigram attributes (w[0], pos[0])
    valid = torch.arange(ids.shape[1]) < train.lengths[:, None]
    assert bool(((ids >= 0).sum(2)[valid] >= 2).all())
    pos = ts.data.conll2000("train", "pos", root=data_root)
    assert pos.num_labels == 44
    # the POS task must not see POS attributes (they would be the answer): word templates only
    assert int((pos.x.ids >= 0).sum(2).max()) == 7  # 5 words and 2 word bigrams
    assert not any("pos[" in a for a in pos.meta["attributes"])
    assert sum("pos[" in a for a in train.meta["attributes"]) > 1000


def test_conll2000_token_ids(data_root):
    train = ts.data.conll2000("train", features="tokens", root=data_root)
    test = ts.data.conll2000("test", features="tokens", root=data_root)
    assert train.x.shape == (8936, 78, 2) and test.x.dtype == torch.long
    words, pos = train.meta["words"], train.meta["pos"]
    assert words[0] == "<unk>" and len(pos) == 45  # 44 tags + unknown
    assert words[int(train.x[0, 0, 0])] == "Confidence" and pos[int(train.x[0, 0, 1])] == "NN"
    valid = torch.arange(78) < train.lengths[:, None]
    assert bool((train.x[valid][:, 0] > 0).all())  # every training word is in the vocabulary
    assert 0 < float((test.x[torch.arange(test.x.shape[1]) < test.lengths[:, None]][:, 0] == 0).float().mean()) < 0.1
    assert ts.data.conll2000("train", "pos", features="tokens", root=data_root).x.shape[2] == 1


def test_conll2000_gold_tags_score_100(data_root):
    test = ts.data.conll2000("test", root=data_root)
    tags = ts.metrics.labels_to_tags(test.y, test.lengths, test.label_names)
    r = chunk_f1(test.tags, test.tags)
    assert r["f1"] == 100.0 and r["gold"] > 20000
    # y maps the unseen I-LST to O, which costs a little recall against the true tags
    assert 99.9 < chunk_f1(tags, test.tags)["f1"] < 100.0


def test_chunks_conlleval_rules():
    assert chunks(["B-NP", "I-NP", "O", "B-VP", "I-VP", "B-NP"]) == {(0, 2, "NP"), (3, 5, "VP"), (5, 6, "NP")}
    assert chunks(["I-NP", "I-NP", "I-VP"]) == {(0, 2, "NP"), (2, 3, "VP")}  # I after O starts a chunk
    assert chunks(["B-NP", "B-NP"]) == {(0, 1, "NP"), (1, 2, "NP")}


def test_chunk_f1_value():
    gold = [["B-NP", "I-NP", "O", "B-VP"], ["B-PP", "B-NP"]]
    pred = [["B-NP", "I-NP", "O", "B-NP"], ["B-PP", "I-PP"]]
    r = chunk_f1(pred, gold)
    # gold chunks 4, predicted 3, correct 1 (the first NP)
    assert (r["correct"], r["predicted"], r["gold"]) == (1, 3, 4)
    assert r["f1"] == pytest.approx(2 * (100 / 3) * 25 / (100 / 3 + 25))


def test_synthetic_chain_is_seeded_and_shares_the_hmm():
    a = ts.data.synthetic_chain("train", 50, seed=4)
    b = ts.data.synthetic_chain("train", 50, seed=4)
    c = ts.data.synthetic_chain("test", 50, seed=4)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.y[:, :4], c.y[:, :4])
    assert int(a.lengths.min()) >= 4 and int(a.lengths.max()) <= 20
    valid = torch.arange(a.y.shape[1]) < a.lengths[:, None]
    assert bool((a.y[valid] >= 0).all()) and bool((a.x[~valid] == 0).all())


class _SeedSpy(torch.Generator):
    """A `torch.Generator` that records the seeds it is given."""

    seeds: list = []

    def manual_seed(self, seed):
        _SeedSpy.seeds.append(int(seed))
        return super().manual_seed(seed)


@pytest.mark.parametrize("generate", [
    lambda seed: [ts.data.synthetic_chain(s, 5, seed=seed) for s in ("train", "test")],
    lambda seed: [ts.data.synthetic_large_chain(s, 5, num_labels=20, seed=seed) for s in ("train", "test")],
    lambda seed: [ts.data.synthetic_type_maps(p, ts.data.edge_types(p, 2, seed=seed), seed=seed)
                  for p in (ts.data.synthetic_pose(s, 12, limb_modes=2, seed=seed) for s in ("train", "test"))],
], ids=["chain", "large_chain", "pose"])
def test_generators_draw_every_seed_from_its_own_streams(monkeypatch, generate):
    """No random stream of one seed is a stream of another (seed 1's model was seeded like seed 0's training
    split); seed 0's streams are ``manual_seed(0..999)``, so its data did not change when this was fixed."""
    monkeypatch.setattr(torch, "Generator", _SeedSpy)
    used = {}
    for seed in range(4):
        _SeedSpy.seeds = []
        generate(seed)
        used[seed] = set(_SeedSpy.seeds)
        assert used[seed], "the generator drew from no seeded stream"
    for a in used:
        for b in used:
            assert a == b or not used[a] & used[b], (a, b, used[a] & used[b])
    assert max(used[0]) < 1000 and min(used[1]) >= 1000


def test_synthetic_chain_checks_its_arguments():
    for kw, match in [({"noise": float("nan")}, r"noise must be finite and in \[0.0, inf\]"),
                      ({"noise": -1.0}, "noise must be"), ({"stickiness": float("inf")}, "stickiness must be"),
                      ({"seed": -1}, "seed must be >= 0")]:
        with pytest.raises(ValueError, match=match):
            ts.data.synthetic_chain("train", 5, **kw)
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        ts.data.synthetic_chain("train", 5, dtype=torch.long)
    with pytest.raises(TypeError, match="seed must be an integer"):
        ts.data.synthetic_chain("train", 5, seed=1.5)


def test_batches_cover_dataset_once():
    ds = ts.data.synthetic_chain("train", 37, seed=1)
    seen = []
    for batch in ds.batches(8, shuffle=True, generator=torch.Generator().manual_seed(0)):
        assert batch.x.shape[1] == int(batch.lengths.max())
        seen.append(batch.lengths.shape[0])
    assert sum(seen) == 37
    assert ds[3].lengths.tolist() == [int(ds.lengths[3])]
    assert torch.equal(ds[torch.tensor(3)].y, ds[3].y) and torch.equal(ds[np.int64(3)].y, ds[3].y)
    with pytest.raises(IndexError):
        ds[37]


def test_missing_data_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="TORCHSSVM_DATA.*download=True"):
        ts.data.ocr(root=str(tmp_path))


def test_yeast_sizes(data_root):
    train, test = ts.data.yeast("train", data_root), ts.data.yeast("test", data_root)
    assert (len(train), len(test)) == (1500, 917)
    assert train.num_features == test.num_features == 103
    assert train.num_labels == test.num_labels == 14
    assert set(train.y.unique().tolist()) == {0, 1}
    # label cardinality of Yeast (Elisseeff & Weston): about 4.24 labels per gene; every gene has one
    assert 4.1 < float(train.y.sum(1).double().mean()) < 4.4
    assert int(train.y.sum(1).min()) >= 1
    assert bool(torch.isfinite(train.x).all()) and float(train.x.abs().max()) <= 1.0
    b = next(train.batches(32))
    assert b.x.shape == (32, 103) and b.y.shape == (32, 14)


def test_libsvm_multilabel_parser_errors():
    from torchssvm.data.yeast import parse_libsvm_multilabel

    x, y = parse_libsvm_multilabel(["0,2 1:0.5 3:-1", "", "1 2:2"], 3, 3)
    assert torch.equal(y, torch.tensor([[1, 0, 1], [0, 1, 0]]))
    assert torch.equal(x, torch.tensor([[0.5, 0.0, -1.0], [0.0, 2.0, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="line 1: label 5"):
        parse_libsvm_multilabel(["5 1:1"], 3, 3)
    with pytest.raises(ValueError, match="line 2: feature id 4"):
        parse_libsvm_multilabel(["0 1:1", "1 4:1"], 3, 3)
    for bad, match in [("0 1", "line 1: '1' is not a feature"), ("0 1:x", "not a feature"),
                       ("0 1:1 1:5", "feature id 1 given twice"), ("0 2:nan", "non-finite"),
                       ("a 1:1", "label 'a'")]:
        with pytest.raises(ValueError, match=match):
            parse_libsvm_multilabel([bad], 3, 3)


def test_multilabel_dataset_indexing():
    ds = ts.data.MultiLabelDataset(torch.arange(12.0).view(6, 2), torch.eye(6, 3, dtype=torch.long))
    assert ds[2].x.tolist() == [[4.0, 5.0]] and ds[-1].x.tolist() == [[10.0, 11.0]]
    assert torch.equal(ds[torch.tensor(2)].x, ds[2].x) and torch.equal(ds[np.int64(2)].x, ds[2].x)
    for bad in (6, -7):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    assert len(list(iter(ds))) == 6  # the sequence protocol ends at the first IndexError
    assert ds[1:4].x.shape == (3, 2)
    with pytest.raises(ValueError, match="batch_size"):
        next(ds.batches(0))
    with pytest.raises(ValueError, match="batch_size"):
        next(ts.data.synthetic_chain("train", 5, seed=0).batches(0))


def test_loader_arguments_are_checked_before_any_data_are_read():
    """Seeds past the generators' 64-bit split streams, a str min_count and an integer OCR dtype raised errors
    that named nothing, or (the dtype) loaded integer pixels."""
    from torchssvm.data.adult import split_indices

    too_big = 2**32
    for make in (lambda: ts.data.synthetic_chain("train", 5, seed=too_big),
                 lambda: ts.data.synthetic_large_chain("train", 5, seed=too_big),
                 lambda: ts.data.checkers(5, seed=too_big), lambda: ts.data.synthetic_pose("train", 2, seed=too_big),
                 lambda: split_indices(10, seed=too_big)):
        with pytest.raises(ValueError, match="seed must be <= 4294967295"):
            make()
    assert torch.equal(ts.data.checkers(5, seed=too_big - 1)[0], ts.data.checkers(5, seed=too_big - 1)[0])
    with pytest.raises(TypeError, match="min_count must be an integer"):
        ts.data.conll2000("train", min_count="3", root="/nonexistent")
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        ts.data.ocr("train", "small", dtype=torch.long, root="/nonexistent")
