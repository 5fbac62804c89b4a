"""`Solver.progress`: called inside a step with the blocks visited, without changing the iterates."""

import pytest
import torch

import torchssvm as ts


def _data():
    return ts.data.synthetic_chain("train", 40, num_labels=3, num_features=4, seed=1, dtype=torch.float64)


def _model(train):
    return ts.LinearChainModel(train.num_features, train.num_labels, dtype=torch.float64)


@pytest.mark.parametrize("make, chunk", [
    (lambda m, d: ts.optim.BCFW(m, d, lam=0.1, seed=0, gap_check_every=1), None),
    (lambda m, d: ts.optim.BCFW(m, d, lam=0.1, seed=0, batch_size=7, gap_check_every=1), None),
    (lambda m, d: ts.optim.FrankWolfe(m, d, lam=0.1, chunk=16), 16),
    (lambda m, d: ts.optim.SSG(m, d, lam=0.1, seed=0), None),
    (lambda m, d: ts.optim.NSlackCuttingPlane(m, d, lam=0.1, seed=0, chunk=16, qp_max_iter=5), 16),
])
def test_progress_counts_blocks_and_leaves_iterates_unchanged(make, chunk):
    train = _data()
    plain, hooked = make(_model(train), train), make(_model(train), train)
    calls = []
    hooked.progress = lambda phase, done, total: calls.append((phase, done, total))
    for _ in range(2):
        plain.step()
        hooked.step()
    assert torch.equal(plain.w, hooked.w)
    passes = [c for c in calls if c[0] == "pass"]
    qp = [c for c in calls if c[0] == "qp"]
    assert all(total == 40 for phase, _, total in calls if phase != "qp")
    if isinstance(hooked, ts.optim.NSlackCuttingPlane):  # the working-set QP's sweeps, at most qp_max_iter
        assert qp and all(total == 5 and 1 <= done <= 5 for _, done, total in qp)
    else:
        assert not qp
    # within each pass the count rises to n, then starts again
    ends = [i for i, c in enumerate(passes) if c[1] == 40]
    assert len(ends) == 2
    first = [done for _, done, _ in passes[: ends[0] + 1]]
    assert first == sorted(first) and first[0] >= 1
    if chunk is not None:
        assert first == [16, 32, 40]
    if isinstance(hooked, ts.optim.BCFW):
        gap = [c for c in calls if c[0] == "gap"]
        assert gap and gap[-1][1] == 40  # the exact gap passes report too


def test_duality_gap_reports_gap_phase():
    train = _data()
    s = ts.optim.BCFW(_model(train), train, lam=0.1, seed=0)
    calls = []
    s.progress = lambda *a: calls.append(a)
    s.duality_gap()
    assert calls == [("gap", 40, 40)]


def test_progress_must_be_callable():
    train = _data()
    s = ts.optim.BCFW(_model(train), train, lam=0.1)
    with pytest.raises(TypeError, match="progress"):
        s.progress = 3
    s.progress = None
    assert s.progress is None


def test_fit_returns_a_history_with_a_one_line_repr():
    train = _data()
    s = ts.optim.BCFW(_model(train), train, lam=0.1, seed=0, gap_check_every=10)
    history = s.fit(max_passes=3)
    assert isinstance(history, list) and len(history) == 3 and history[-1] is not history[0]
    text = repr(history)
    assert "\n" not in text and text.startswith("History(3 steps; last: ")
    assert "(estimate)" in text  # no exact gap pass yet: the gap is BCFW's estimate
    assert repr(ts.optim.History()) == "History(0 steps)"
    assert f"gap={history[-1]['gap']:.4g}" in text


def test_recipes_pass_their_progress_hook_on():
    train = _data()
    test = ts.data.synthetic_chain("test", 10, num_labels=3, num_features=4, seed=1, dtype=torch.float64)
    calls = []
    ts.recipes.train_chain_dual(train, test, passes=1, gap_check_every=1, logdir=None,
                                progress=lambda *a: calls.append(a))
    assert ("pass", 40, 40) in calls and ("gap", 40, 40) in calls
    calls.clear()
    train32 = ts.data.synthetic_chain("train", 40, num_labels=3, num_features=4, seed=1)
    ts.recipes.train_chain_hinge(train32, test, epochs=1, batch_size=16, lr=0.01, lam=0.0, logdir=None,
                                 progress=lambda *a: calls.append(a))
    assert calls == [("epoch", 1, 3), ("epoch", 2, 3), ("epoch", 3, 3)]
