"""Binary SVM data: the a9a loader against the documented sizes, and the seeded checkerboard."""

import gzip
import os
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA

import torchssvm as ts
from torchssvm.data import adult
from torchssvm.data.adult import parse_libsvm_binary, split_indices
from torchssvm.data.paths import sha256


@pytest.fixture(scope="module")
def a9a_root():
    """The data root holding ``adult/a9a.txt.gz`` (like conftest's ``data_root``, but needing only this
    file); skipped when it is missing, a failure in CI."""
    root = Path(os.environ.get("TORCHSSVM_DATA", SHARED_DATA))
    if not (root / adult.RELPATH).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{adult.RELPATH} not found under {root} (CI must have ../shared/data)")
        pytest.skip(f"{adult.RELPATH} not found under {root}")
    return str(root)


def _write(root: Path, lines) -> str:
    path = root / adult.RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return str(root)


# ----------------------------------------------------------------------------------------------------- a9a


def test_a9a_file_checksum(a9a_root):
    assert sha256(Path(a9a_root) / adult.RELPATH) == adult.SHA256


def test_a9a_all_sizes_and_values(a9a_root):
    x, y = ts.data.a9a("all", root=a9a_root)
    assert x.shape == (32561, 123) and y.shape == (32561,)
    assert x.dtype == torch.float32 and y.dtype == torch.long
    assert bool(((x == 0) | (x == 1)).all()) and bool((x == 1).any())  # binary features
    # every example has 11..14 active features (one per categorical/binned attribute, some missing)
    active = x.sum(1)
    assert int(active.min()) >= 11 and int(active.max()) == 14
    assert int((x.sum(0) > 0).sum()) == 123  # every feature id occurs
    assert set(y.unique().tolist()) == {-1, 1}
    # a9a's positive rate (income > 50K): 7,841 / 32,561 = 24.08%
    assert int((y == 1).sum()) == adult.NUM_POSITIVE == 7841
    assert float((y == 1).double().mean()) == pytest.approx(0.2408, abs=5e-4)


def test_a9a_split_sizes_disjoint_and_covering(a9a_root):
    x_all, y_all = ts.data.a9a("all", root=a9a_root)
    xtr, ytr = ts.data.a9a("train", root=a9a_root)
    xte, yte = ts.data.a9a("test", root=a9a_root)
    assert (xtr.shape, xte.shape) == ((22793, 123), (9768, 123))
    assert len(ytr) + len(yte) == 32561
    tr, te = split_indices(32561, 0.3, 0)
    assert len(set(tr.tolist()) & set(te.tolist())) == 0
    assert torch.equal(torch.cat([tr, te]).sort().values, torch.arange(32561))
    assert torch.equal(xtr, x_all[tr]) and torch.equal(ytr, y_all[tr])
    assert torch.equal(xte, x_all[te]) and torch.equal(yte, y_all[te])
    # both sides keep the positive rate (a random split, not a sorted cut)
    assert abs(float((ytr == 1).double().mean()) - 0.2408) < 0.01
    assert abs(float((yte == 1).double().mean()) - 0.2408) < 0.01
    # Yu & Joachims' 22,697 training examples
    assert len(ts.data.a9a("train", test_fraction=9864 / 32561, root=a9a_root)[1]) == 22697


def test_a9a_split_is_seeded(a9a_root):
    a = ts.data.a9a("test", seed=3, root=a9a_root)
    b = ts.data.a9a("test", seed=3, root=a9a_root)
    c = ts.data.a9a("test", seed=4, root=a9a_root)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape == c[0].shape and not torch.equal(a[0], c[0])
    tr3, te3 = split_indices(32561, 0.3, 3)
    tr4, te4 = split_indices(32561, 0.3, 4)
    assert not torch.equal(te3, te4)
    x64, _ = ts.data.a9a("test", seed=3, root=a9a_root, dtype=torch.float64)
    assert x64.dtype == torch.float64 and torch.equal(x64.float(), a[0])


def test_a9a_parses_once_and_returns_fresh_tensors(a9a_root):
    ts.data.a9a("train", root=a9a_root)
    info = adult._load_all.cache_info()
    x, y = ts.data.a9a("all", root=a9a_root)
    ts.data.a9a("test", root=a9a_root)
    after = adult._load_all.cache_info()
    assert after.misses == info.misses and after.hits == info.hits + 2
    x[:] = 7.0
    y[:] = 0
    x2, y2 = ts.data.a9a("all", root=a9a_root)
    assert float(x2.max()) == 1.0 and set(y2.unique().tolist()) == {-1, 1}


# ------------------------------------------------------------------------------------------ a9a: errors


def test_libsvm_binary_parser():
    x, y = parse_libsvm_binary(["+1 1:0.5 3:-1", "", "-1 2:2", "1"], 3)
    assert torch.equal(y, torch.tensor([1, -1, 1]))
    assert torch.equal(x, torch.tensor([[0.5, 0.0, -1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("bad, message", [
    ("0 1:1", "line 2: label must be"),
    ("1:1 2:1", "line 2: label must be"),
    ("+1 4:1", "line 2: feature id 4 outside"),
    ("+1 0:1", "line 2: feature id 0 outside"),
    ("-1 1:1 1:1", "line 2: feature id 1 appears twice"),
    ("-1 1:x", "line 2: expected idx:value"),
    ("-1 1", "line 2: expected idx:value"),
    ("-1 a:1", "line 2: expected idx:value"),
    ("-1 1:1:1", "line 2: expected idx:value"),
    ("-1 2:nan", "line 2: feature 2 has non-finite"),
])
def test_libsvm_binary_parser_errors_name_the_line(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_libsvm_binary(["-1 1:1 3:1", bad, "+1 2:1"], 3, source="f.txt")


def test_a9a_malformed_file_names_the_line(tmp_path):
    root = _write(tmp_path, ["-1 3:1 11:1", "+1 5:1", "+1 7:1 124:1"])
    with pytest.raises(ValueError, match=r"a9a\.txt\.gz: line 3: feature id 124 outside \[1, 123\]"):
        ts.data.a9a("all", root=root)


def test_a9a_wrong_size_file(tmp_path):
    root = _write(tmp_path, ["-1 3:1 11:1", "+1 5:1"])
    with pytest.raises(ValueError, match="expected 32,561 examples"):
        ts.data.a9a("train", root=root)


def test_a9a_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="TORCHSSVM_DATA.*adult/a9a.txt.gz"):
        ts.data.a9a(root=str(tmp_path))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"split": "valid"}, ValueError, "split must be one of"),
    ({"test_fraction": 0.0}, ValueError, "test_fraction must be in"),
    ({"test_fraction": 1.0}, ValueError, "test_fraction must be in"),
    ({"test_fraction": 1e-6}, ValueError, "test_fraction=1e-06 leaves an empty"),
    ({"test_fraction": "0.3"}, TypeError, "test_fraction must be a number"),
    ({"seed": 1.5}, TypeError, "seed must be an integer"),
    ({"dtype": torch.long}, TypeError, "dtype must be a floating-point"),
])
def test_a9a_argument_errors(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):  # checked before the file is looked for
        ts.data.a9a(root=str(tmp_path), **kwargs)


# -------------------------------------------------------------------------------------------- checkers


def _parity(x, grid=4):
    cell = x.double().floor().long()
    return 1 - 2 * (cell.sum(1) % 2)


def test_checkers_shapes_and_balance():
    x, y = ts.data.checkers(20000)
    assert x.shape == (20000, 2) and y.shape == (20000,)
    assert x.dtype == torch.float32 and y.dtype == torch.long
    assert set(y.unique().tolist()) == {-1, 1}
    assert abs(float((y == 1).double().mean()) - 0.5) < 0.02
    # jittered by noise 0.02: a little outside the [0, 4]^2 board of unit cells, never far
    assert -0.15 < float(x.min()) < 0 and 4 < float(x.max()) < 4.15
    # all 16 cells are populated about equally
    cells = ((x.double().clamp(0, 4 - 1e-9)).floor().long() * torch.tensor([4, 1])).sum(1)
    counts = torch.bincount(cells, minlength=16)
    assert counts.numel() == 16 and int(counts.min()) > 1000


def test_checkers_is_seeded():
    a = ts.data.checkers(500, seed=5)
    b = ts.data.checkers(500, seed=5)
    c = ts.data.checkers(500, seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    d = ts.data.checkers(500, seed=5, dtype=torch.float64)
    assert d[0].dtype == torch.float64 and torch.equal(d[0].float(), a[0]) and torch.equal(d[1], a[1])


def test_checkers_labels_are_cell_parity():
    x, y = ts.data.checkers(5000, noise=0.0, seed=1)
    assert float(x.min()) >= 0 and float(x.max()) < 4
    assert torch.equal(y, _parity(x))
    x3, y3 = ts.data.checkers(5000, grid=3, noise=0.0, seed=1)
    assert float(x3.max()) < 3 and torch.equal(y3, _parity(x3, 3))
    # the cell at the origin is +1
    assert bool((y[(x < 1).all(1)] == 1).all())


def test_checkers_noise_jitters_points_after_labelling():
    x, y = ts.data.checkers(50000, noise=0.02, seed=2)
    xd = x.double()
    # distance to the nearest interior grid line (1, 2, 3) in either coordinate
    lines = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    dist = (xd.unsqueeze(2) - lines).abs().amin(2).amin(1)
    inside = ((xd > 0) & (xd < 4)).all(1)
    far = inside & (dist > 0.1)  # 5 sigma away from every border
    assert int(far.sum()) > 5000 and torch.equal(y[far], _parity(x[far]))
    # near borders some labels belong to the neighbouring cell: about 2 sqrt(2/pi) noise 3 / 4 = 2.4%
    wrong = float((y[inside] != _parity(x[inside])).double().mean())
    assert 0.018 < wrong < 0.030
    # the labels are those of the clean points: the same seed without noise gives the same labels
    assert torch.equal(y, ts.data.checkers(50000, noise=0.0, seed=2)[1])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"n": 0}, ValueError, "n must be >= 1"),
    ({"n": 2.5}, TypeError, "n must be an integer"),
    ({"grid": 1}, ValueError, "grid must be >= 2"),
    ({"grid": 4.0}, TypeError, "grid must be an integer"),
    ({"noise": -0.1}, ValueError, "noise must be finite and >= 0"),
    ({"noise": float("nan")}, ValueError, "noise must be finite and >= 0"),
    ({"noise": float("inf")}, ValueError, "noise must be finite and >= 0"),
    ({"noise": "0.1"}, TypeError, "noise must be a number"),
    ({"seed": -1}, ValueError, "seed must be >= 0"),
    ({"dtype": torch.int64}, TypeError, "dtype must be a floating-point"),
])
def test_checkers_argument_errors(kwargs, error, message):
    kwargs = {"n": 10, **kwargs}
    with pytest.raises(error, match=message):
        ts.data.checkers(**kwargs)
