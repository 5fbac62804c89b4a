"""What every solver's `load_state_dict` refuses, and that a refused state changes nothing.

A state saved under another objective (lam, rescaling, box, number of examples, kernel) must raise, not be adopted:
its blocks or cuts would certify an objective the solver is not minimizing. The resumed trajectories themselves are
tested next to each solver (``test_state_dict_resumes_*``)."""

import pytest
import torch
from test_cutting_plane import random_table

import torchssvm as ts
from torchssvm.optim import (
    BCFW,
    BMRM,
    SSG,
    FeatureTableProblem,
    FrankWolfe,
    KernelCuttingPlane,
    NSlackCuttingPlane,
    OneSlackCuttingPlane,
)


def _table(n=20, d=4, seed=1):
    return FeatureTableProblem(*random_table(n=n, K=5, d=d, seed=seed))


def _snapshot(solver) -> dict:
    state = solver.state_dict()
    flat = {k: v for k, v in state.items() if k not in ("atoms", "last_exact", "generator")}
    flat.update({f"atoms.{k}": v for k, v in (state.get("atoms") or {}).items()})
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in flat.items()}


def _unchanged(before: dict, solver) -> bool:
    after = _snapshot(solver)
    return all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k] for k, v in before.items())


DUAL_SOLVERS = [FrankWolfe, NSlackCuttingPlane, lambda p, **kw: BCFW(p, step="pairwise", cache_size=3, **kw)]


@pytest.mark.parametrize("make", DUAL_SOLVERS, ids=["fw", "nslack", "bcfw"])
def test_dual_solvers_refuse_another_objective_and_change_nothing(make):
    source = make(_table(), lam=0.05)
    for _ in range(3):
        source.step()
    state = source.state_dict()
    cases = {"lam": (dict(lam=0.5), "lam"),
             "rescaling": (dict(lam=0.05, rescaling="slack"), "rescaling"),
             "box": (dict(lam=0.05, box=(0.0, None)), "box")}
    if make is NSlackCuttingPlane:
        del cases["box"]  # it takes no box
    for what, (kw, match) in cases.items():
        target = make(_table(), **kw)
        target.step()
        before = _snapshot(target)
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(state)
        assert _unchanged(before, target), what
    # another d with the same n: the first tensors fit, v does not; nothing may be set before the error
    target = make(_table(), lam=0.05)
    target.step()
    before = _snapshot(target)
    with pytest.raises(ValueError, match="state_dict\\['v'\\]"):
        target.load_state_dict(make(_table(d=6, seed=2), lam=0.05).state_dict())
    assert _unchanged(before, target)
    target.load_state_dict(state)  # the matching state still loads, and continues the source's run
    assert target.step()["dual"] == source.step()["dual"]


@pytest.mark.parametrize("make", [*DUAL_SOLVERS, lambda p, lam: SSG(p, lam=lam), lambda p, lam: BMRM(p, lam=lam)],
                         ids=["fw", "nslack", "bcfw", "ssg", "bmrm"])
def test_a_state_holding_nan_is_refused_and_changes_nothing(make):
    """A NaN in any float tensor of a state is corruption (block gaps may hold +inf, never NaN): loading it would
    carry NaN into every later step and certificate."""
    source = make(_table(), lam=0.05)
    source.step()
    state = source.state_dict()
    floats = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    assert floats
    for key in floats:
        target = make(_table(), lam=0.05)
        target.step()
        before = _snapshot(target)
        broken = state[key].clone()
        broken.view(-1)[0] = float("nan")
        with pytest.raises(ValueError, match=f"state_dict\\['{key}'\\] holds NaN"):
            target.load_state_dict(dict(state, **{key: broken}))
        assert _unchanged(before, target), key


def test_bcfw_resumes_after_its_atom_storage_grew_and_refuses_broken_counts():
    source = BCFW(_table(), lam=0.05, step="pairwise", cache_size=2, seed=3)
    for _ in range(4):
        source.step()
    state = source.state_dict()
    assert state["atoms"]["labels"].shape[1] > 2  # pairwise steps keep every active atom: the storage grew
    resumed = BCFW(_table(), lam=0.05, step="pairwise", cache_size=2, seed=3)
    resumed.load_state_dict(state)
    a, b = resumed.step(), source.step()
    assert {k: v for k, v in a.items() if k != "time"} == {k: v for k, v in b.items() if k != "time"}
    broken = dict(state, atoms=dict(state["atoms"], count=state["atoms"]["count"] * 0))
    target = BCFW(_table(), lam=0.05, step="pairwise", cache_size=2, seed=3)
    before = _snapshot(target)
    with pytest.raises(ValueError, match="count.. must be in"):
        target.load_state_dict(broken)
    assert _unchanged(before, target)


def test_bcfw_refuses_another_cache_capacity_and_a_broken_permutation():
    source = BCFW(_table(), lam=0.05, cache_size=3)
    source.step()
    with pytest.raises(ValueError, match="capacity"):
        BCFW(_table(), lam=0.05, cache_size=5).load_state_dict(source.state_dict())
    state = source.state_dict()
    state["first_visit"] = torch.zeros_like(state["first_visit"])
    with pytest.raises(ValueError, match="first_visit"):
        BCFW(_table(), lam=0.05, cache_size=3).load_state_dict(state)
    state = source.state_dict()
    state["generator"] = torch.zeros(3)
    with pytest.raises(ValueError, match="generator"):
        BCFW(_table(), lam=0.05, cache_size=3).load_state_dict(state)


@pytest.mark.parametrize("cls", [BMRM, OneSlackCuttingPlane])
def test_bundle_solvers_refuse_another_training_set_size_and_lam(cls):
    source = cls(_table(n=20), lam=0.05, eps=1e-4)
    for _ in range(4):
        source.step()
    state = source.state_dict()
    for problem, lam, match in ((_table(n=12, seed=7), 0.05, "n = 20"), (_table(n=20), 0.5, "lam")):
        target = cls(problem, lam=lam, eps=1e-4)
        target.step()
        before = _snapshot(target)
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(state)
        assert _unchanged(before, target)


def test_one_slack_resumes_an_unsolved_qp(monkeypatch):
    """``qp_solved`` is saved: when the last working-set QP stopped short of its tolerance, the uninterrupted run
    solves it again on a pass that adds no cut, and so does the resumed one."""
    import torchssvm.optim.cutting_planes.bmrm as bmrm

    solve = bmrm.simplex_qp
    monkeypatch.setattr(bmrm, "simplex_qp", lambda *a, **kw: solve(*a, **{**kw, "max_iter": 1, "method": "fista"}))

    def make():
        return OneSlackCuttingPlane(_table(), lam=0.05, eps=0.5)

    whole = make()
    reports = [whole.step() for _ in range(6)]
    part = make()
    for _ in range(2):
        part.step()
    assert not part.qp_solved  # the capped QP: the case this test is about
    resumed = make()
    resumed.load_state_dict(part.state_dict())
    assert [(r["added"], r["converged"], r["primal"]) for r in (resumed.step() for _ in range(4))] == \
        [(r["added"], r["converged"], r["primal"]) for r in reports[2:]]


def test_ssg_refuses_other_sizes_and_settings_and_changes_nothing():
    source = SSG(_table(), lam=0.05, seed=1)
    source.step()
    state = source.state_dict()
    for kw, problem, match in ((dict(lam=0.05), _table(d=6, seed=2), "state_dict\\['w'\\]"),
                               (dict(lam=0.5), _table(), "lam"), (dict(lam=0.05, box=(0.0, None)), _table(), "box"),
                               (dict(lam=0.05, averaging=False), _table(), "averaging")):
        target = SSG(problem, seed=1, **kw)
        target.step()
        before = _snapshot(target)
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(state)
        assert _unchanged(before, target)
    with pytest.raises(ValueError, match="missing"):
        SSG(_table(), lam=0.05).load_state_dict({k: v for k, v in state.items() if k != "generator"})
    target = SSG(_table(), lam=0.05, seed=1)
    before = _snapshot(target)
    with pytest.raises(ValueError, match="state_dict\\['k'\\] must be a int"):
        target.load_state_dict(dict(state, k=None))  # after w was checked, before anything is set
    assert _unchanged(before, target)
    with pytest.raises(ValueError, match="rescaling"):
        SSG(_table(), lam=0.05, rescaling="slack").load_state_dict(state)


def test_kernel_cutting_plane_refuses_another_training_set_or_kernel():
    x, y = ts.data.checkers(100, seed=1, dtype=torch.float64)
    source = KernelCuttingPlane(x, y, C=1.0, gamma=2.0, sampling="exact")
    for _ in range(3):
        source.step()
    state = source.state_dict()
    for target, match in ((KernelCuttingPlane(x[:80], y[:80], C=1.0, gamma=2.0, sampling="exact"), "N = 100"),
                          (KernelCuttingPlane(x, y, C=1.0, gamma=50.0, sampling="exact"), "gamma"),
                          (KernelCuttingPlane(x, y, C=2.0, gamma=2.0, sampling="exact"), "C = 1.0"),
                          (KernelCuttingPlane(x, y, C=1.0, gamma=2.0, sampling="constant", r=30), "sampling")):
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(state)
    target = KernelCuttingPlane(x, y, C=1.0, gamma=2.0, sampling="exact")
    before = _snapshot(target)
    for broken, match in ((dict(state, basis=state["basis"] + 100), "basis"),
                          (dict(state, seconds="x"), "seconds")):
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(broken)
        assert _unchanged(before, target)
    resumed = KernelCuttingPlane(x, y, C=1.0, gamma=2.0, sampling="exact")
    resumed.load_state_dict(state)
    assert resumed.step()["gap"] == source.step()["gap"]
