"""Edits of a saved state that keep its recomputed identities, and states of another objective: refused.

`tests/test_state_trust.py` edits one tensor at a time, which breaks the identities `_check_consistency` recomputes.
A script that edits a state's free part and recomputes what depends on it (a chain's ``z`` and ``v``, a bundle's cuts
and its model value) keeps them; so does a state saved under another rescaling, model structure or ``lam``. Each of
these loaded as it was would certify a dual above the optimum (reproduced before the checks existed: a chain state
with its transition counts zeroed stopped ``fit(gap_tol=1e-2)`` at a gap of 0.0069 while the primal was 0.081 above
the optimum; a forged bundle reported ``converged`` with a gap of -0.02).
"""

import pytest
import torch
from test_cutting_plane import random_table

import torchssvm as ts
from torchssvm.optim import (
    BCFW,
    BMRM,
    GDMM,
    FeatureTableProblem,
    FrankWolfe,
    MultiLabelProblem,
    NSlackCuttingPlane,
    OneSlackCuttingPlane,
    SlackRescaledProblem,
)
from torchssvm.optim.cutting_planes.risks import StructuredRisk
from torchssvm.optim.fingerprint import fingerprint
from torchssvm.structures.multilabel import MultiLabel


def _chain(n=24):
    return ts.data.synthetic_chain("train", n=n, num_labels=4, num_features=5, min_length=2, max_length=6, seed=0,
                                   dtype=torch.float64)


def _model(ds):
    return ts.models.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)


def _with_v_of(state: dict, problem, z: torch.Tensor, lam: float) -> dict:
    """``state`` with blocks ``z`` and the ``v`` they imply (`DualSolver._check_consistency`'s identity)."""
    idx = torch.arange(problem.n)
    v = problem.initial_w().to(torch.float64).clone()
    problem.accumulate(v, idx, z, torch.full((problem.n,), 1.0 / (lam * problem.n), dtype=torch.float64))
    return dict(state, z=z, v=v)


@pytest.mark.parametrize("part", ["transitions, start and end", "start and end"])
@pytest.mark.parametrize("cls", [BCFW, FrankWolfe])
def test_chain_blocks_edited_with_their_v_are_refused_even_with_a_rewritten_seal(cls, part):
    ds, lam = _chain(), 2.0
    source = cls(_model(ds), ds, lam=lam)
    source.fit(max_passes=10)
    state = source.state_dict()
    p = source.problem
    a, b, _ = p._cut
    z = state["z"].clone()
    z[:, a if part.startswith("transitions") else b:] = 0.0  # each part still sums to 0, within its bounds
    forged = _with_v_of(state, p, z, lam)
    with pytest.raises(ValueError, match=r"\['z'\] was changed after the state was saved"):
        cls(_model(ds), ds, lam=lam).load_state_dict(forged)
    # a forger who also rewrites the seal meets the chain's constraints (start / end = the unary part at the ends,
    # the transition counts' row and column sums)
    forged["seal"] = {**forged["seal"], "z": fingerprint({"z": z})}
    with pytest.raises(ValueError, match="marginal constraints"):
        cls(_model(ds), ds, lam=lam).load_state_dict(forged)


@pytest.mark.parametrize("kw", [{}, {"step": "pairwise", "cache_size": 4}, {"step": "away", "cache_size": 4},
                                {"batch_size": 4, "sampling": "gap", "step": "pairwise", "cache_size": 4}])
def test_chain_constraints_hold_for_trained_blocks(kw):
    """No false alarm: the blocks BCFW leaves meet every constraint `ChainProblem.block_violation` checks, to
    rounding; a labelling's own corner minus another's meets them exactly."""
    ds = _chain()
    s = BCFW(_model(ds), ds, lam=0.5, seed=0, **kw)
    s.fit(max_passes=20)
    idx = torch.arange(s.n)
    assert float(s.problem.block_violation(idx, s.z).max()) < 1e-12
    other = torch.roll(s.problem.truth, 1, dims=1).clamp_min(0)
    other = torch.where(s.problem.truth >= 0, other, -1)
    corner = s.problem.corner(idx, other)
    assert float(s.problem.block_violation(idx, corner).max()) == 0.0
    assert float(s.problem.block_violation(idx, corner * 1.5).max()) > 0.1  # outside: mu_t = 1.5 e_y - 0.5 e_y'


def test_each_transition_constraint_catches_its_own_edit():
    """Edits of the transition part alone, v recomputed and the seal rewritten, each caught by one constraint of
    `ChainProblem.block_violation`: the part zeroed breaks the row / column sums only (the unary, start and end
    parts are untouched); a circulation (+5 on k->l and l->k, -5 on k->k and l->l) keeps every sum and breaks only
    the counts' nonnegativity (``N = m_trans(y_i) - z_trans >= 0``)."""
    ds, lam = _chain(), 2.0
    source = BCFW(_model(ds), ds, lam=lam)
    source.fit(max_passes=10)
    state, p = source.state_dict(), source.problem
    a, b, _ = p._cut
    K, idx = p.K, torch.arange(p.n)
    zeroed = state["z"].clone()
    zeroed[:, a:b] = 0.0
    circulation = state["z"].clone()
    trans = circulation[:, a:b].view(-1, K, K)
    trans[:, 0, 1] += 5.0
    trans[:, 1, 0] += 5.0
    trans[:, 0, 0] -= 5.0
    trans[:, 1, 1] -= 5.0
    for z in (zeroed, circulation):
        assert float(p.block_violation(idx, z).max()) > 0.5
        forged = _with_v_of(state, p, z, lam)
        forged["seal"] = {**forged["seal"], "z": fingerprint({"z": z})}
        with pytest.raises(ValueError, match="marginal constraints"):
            BCFW(_model(ds), ds, lam=lam).load_state_dict(forged)


def test_z_is_sealed_where_its_constraints_are_necessary_only():
    """A chain's transition counts sum the per-position pair marginals, so its constraints are necessary only
    ("a b a" has the sums of "a a" and "b b"): its z is sealed. A feature table's simplex is the whole marginal
    polytope: its z is checked, not sealed. The n-slack working sets rebuild z: nothing sealed."""
    ds = _chain()
    chain = BCFW(_model(ds), ds, lam=0.5)
    table = BCFW(FeatureTableProblem(*random_table(n=16)), lam=0.05)
    assert "z" in chain.state_dict()["seal"]
    assert "seal" not in table.state_dict()
    assert "seal" not in NSlackCuttingPlane(_model(ds), ds, lam=0.5).state_dict()
    assert not chain.problem.block_violation_exact and table.problem.block_violation_exact


def _bundle(cls, problem, lam=0.01):
    s = cls(StructuredRisk(problem), lam=lam, eps=1e-8)
    s.fit(max_passes=30)
    return s


@pytest.mark.parametrize("cls", [BMRM, OneSlackCuttingPlane])
def test_bundles_of_the_other_rescaling_are_refused(cls):
    F, L, y = random_table(n=16, K=5, d=4, seed=1)
    L = L.clamp_max(1.0)
    margin, slack = (lambda: FeatureTableProblem(F, L, y)), (lambda: SlackRescaledProblem(FeatureTableProblem(F, L, y)))
    for source, target, saved in ((margin, slack, "margin"), (slack, margin, "slack")):
        state = _bundle(cls, source()).state_dict()
        with pytest.raises(ValueError, match=f"rescaling = '{saved}'"):
            cls(StructuredRisk(target()), lam=0.01, eps=1e-8).load_state_dict(state)
    # a dual solver's state too: the slack-rescaled problem's fingerprint says so
    assert margin().fingerprint_data().keys() != slack().fingerprint_data().keys()


def test_a_bundle_whose_cuts_are_raised_with_their_model_value_is_refused():
    """The cuts are sealed: w, the model value and the best primal are recomputed from them, but a cut itself
    bounds the risk only because the oracle made it, which nothing in the state can show."""
    F, L, y = random_table(n=16, K=5, d=4, seed=1)
    lam = 0.01
    source = _bundle(BMRM, FeatureTableProblem(F, L, y), lam)
    st = source.state_dict()
    lo, hi = source.risk.offset_range()
    offsets = (st["offsets"] + 0.02).clamp_max(hi)
    v = st["alpha"] @ st["cuts"]
    model_value = float(st["alpha"] @ offsets) - 0.5 * float(v @ v) / lam
    forged = dict(st, offsets=offsets, model_value=model_value)
    with pytest.raises(ValueError, match=r"\['offsets'\] was changed after the state was saved"):
        BMRM(StructuredRisk(FeatureTableProblem(F, L, y)), lam=lam, eps=1e-8).load_state_dict(forged)
    BMRM(StructuredRisk(FeatureTableProblem(F, L, y)), lam=lam, eps=1e-8).load_state_dict(st)  # unedited: loads


@pytest.mark.parametrize("saved, target", [({"edges": [(0, 2), (1, 3)]}, {"edges": [(0, 1), (2, 3)]}),
                                           ({"normalize": False}, {"normalize": True})])
def test_a_multilabel_state_of_another_structure_is_refused(saved, target):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=g, dtype=torch.float64)
    y = (torch.randn(12, 4, generator=g) > 0).long()
    source = BCFW(MultiLabelProblem(x, y, MultiLabel(4, **saved)), lam=0.05)
    source.fit(max_passes=3)
    with pytest.raises(ValueError, match="another model structure"):
        BCFW(MultiLabelProblem(x, y, MultiLabel(4, **target)), lam=0.05).load_state_dict(source.state_dict())
    BCFW(MultiLabelProblem(x, y, MultiLabel(4, **saved)), lam=0.05).load_state_dict(source.state_dict())


def test_a_gdmm_state_of_another_lam_is_refused(tmp_path):
    ds = _chain(n=12)
    path = tmp_path / "gdmm.ckpt"
    GDMM(_model(ds), ds, lam=0.05, rho=1.0).fit(max_iter=5, checkpoint=path)
    target = GDMM(_model(ds), ds, lam=0.5, rho=1.0)
    with pytest.raises(ValueError, match=r"C = .*\(lam = 0\.05\); this solver has C"):
        target.fit(max_iter=10, checkpoint=path)
    assert target.lam == 0.5
    same = GDMM.from_C(_model(ds), ds, 1.0 / (0.05 * 12), rho=1.0)  # the same objective given by C: loads
    same.fit(max_iter=6, checkpoint=path)
    assert same.iterations == 6


def test_states_of_other_versions_say_so():
    """A state without ``state_version`` (saved before it was recorded) that fails a check says it is older, not
    only that its data differ; one that passes every check still loads; a newer version is refused."""
    ds = _chain()
    chain = BCFW(_model(ds), ds, lam=0.5)
    chain.fit(max_passes=2)
    old = {k: v for k, v in chain.state_dict().items() if k not in ("state_version", "seal")}
    with pytest.raises(ValueError, match="older than state version 2"):
        BCFW(_model(ds), ds, lam=0.5).load_state_dict(old)
    table = BCFW(FeatureTableProblem(*random_table(n=16)), lam=0.05)
    table.fit(max_passes=2)
    state = table.state_dict()
    assert state["state_version"] == 2
    BCFW(FeatureTableProblem(*random_table(n=16)), lam=0.05).load_state_dict(
        {k: v for k, v in state.items() if k != "state_version"})
    with pytest.raises(ValueError, match="saved by a newer torchssvm"):
        BCFW(FeatureTableProblem(*random_table(n=16)), lam=0.05).load_state_dict({**state, "state_version": 3})
