"""A loaded state is checked, not trusted: the bundle, kernel, GDMM and primal solvers.

For each solver a state is saved after a few steps, then every state tensor is edited in turn (bytes flipped at
random positions, plus 1, times 1.01, zeroed, converted to float32) and every counter made negative or moved. Each
edited state must be refused (a ValueError) or harmless: the loaded solver's next report equals the original's to
rounding. A few entries are free by construction (any value is a valid state: GDMM's multipliers and its C / rho /
eta, Pragam's L above the Lipschitz bound, SSG's iterates, which certify nothing): an edit of those may change the
run, and the test then checks that the next report is still true (`FREE`). Also: a state of other data with the same
sizes is refused, reports say what they certify, non-finite data are refused up front, ``converged`` is never set
on NaN."""

import math

import pytest
import torch
from test_cutting_plane import random_table

import torchssvm as ts
from torchssvm.optim import (
    BMRM,
    GDMM,
    SSG,
    FeatureTableProblem,
    KernelCuttingPlane,
    MulticlassPragam,
    MultiLabelProblem,
    OneSlackCuttingPlane,
    Pragam,
)
from torchssvm.optim.cutting_planes import HingeRisk, MaxOfLinearRisk
from torchssvm.structures import Chain, MultiLabel

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _edits(state: dict, seed: int = 0):
    """``(name, edited state)``: per tensor two byte flips, +1, *1.01, zero, float32; per counter -1 and +1."""
    gen = torch.Generator().manual_seed(seed)
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.numel() and key != "generator":
            for j in range(2):
                t = value.clone().contiguous()
                raw = t.view(-1).view(torch.uint8)
                pos = int(torch.randint(raw.numel(), (1,), generator=gen))
                raw[pos] ^= int(torch.randint(1, 256, (1,), generator=gen))
                yield f"{key}:flip{j}", {**state, key: t}
            yield f"{key}:+1", {**state, key: value + 1}
            yield f"{key}:zero", {**state, key: torch.zeros_like(value)}
            if value.is_floating_point():
                yield f"{key}:*1.01", {**state, key: value * 1.01}
                yield f"{key}:float32", {**state, key: value.float()}
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            yield f"{key}:negative", {**state, key: -1}
            yield f"{key}:+1", {**state, key: value + 1}
        elif isinstance(value, float) and math.isfinite(value):
            yield f"{key}:negative", {**state, key: -abs(value) - 1.0}
            yield f"{key}:*1.01", {**state, key: value * 1.01 + 1e-3}


def _close(a, b, atol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=atol)


def _fuzz(make, steps: int, keys: tuple, *, free=None, atol: float = 1e-12, next_report=None):
    """Counts ``{"refused", "harmless", "free"}`` of the edits of a state of ``make()`` after ``steps`` steps;
    fails on an accepted edit that changes the next report (outside ``free``: ``{key: check(solver, report)}``)."""
    next_report = next_report or (lambda s: s.step())
    source = make()
    for _ in range(steps):
        source.step()
    state = source.state_dict()
    reference = make()
    reference.load_state_dict(state)  # the unedited state loads
    expected = next_report(reference)
    counts = {"refused": 0, "harmless": 0, "free": 0}
    for name, edited in _edits(state):
        target = make()
        try:
            target.load_state_dict(edited)
        except ValueError:
            counts["refused"] += 1
            continue
        report = next_report(target)
        if all(_close(expected.get(k), report.get(k), atol) for k in keys):
            counts["harmless"] += 1
            continue
        key = name.split(":")[0]
        assert free is not None and key in free, f"{name} was accepted and changed the next report: " + str(
            {k: (expected.get(k), report.get(k)) for k in keys})
        free[key](target, report)  # an edit of a free entry: the report must still be true
        counts["free"] += 1
    assert counts["refused"] > counts["harmless"] + counts["free"], counts
    return counts


# -- bundle methods ----------------------------------------------------------------------------------


def _table(seed=1, n=20):
    return FeatureTableProblem(*random_table(n=n, K=5, d=4, seed=seed))


BUNDLES = {
    "bmrm-qp": lambda data=None: BMRM(data or _table(), lam=0.05, eps=1e-6),
    "bmrm-ls": lambda data=None: BMRM(data or _table(), lam=0.05, eps=1e-6, variant="ls"),
    "oneslack": lambda data=None: OneSlackCuttingPlane(data or _table(), lam=0.05, eps=1e-4, inactive_after=2),
}


@pytest.mark.parametrize("name", list(BUNDLES))
def test_bundle_states_are_checked(name):
    counts = _fuzz(BUNDLES[name], 5, ("primal", "dual", "gap", "eps", "best_primal"))
    assert counts["free"] == 0


def test_bundle_identities_are_named():
    source = BMRM(_table(), lam=0.05)
    for _ in range(4):
        source.step()
    state = source.state_dict()
    for key, value, match in (("w", state["w"] * 1.01, "'w'.*alpha_k g_k"),
                              ("alpha", state["alpha"] * 0.5, "'alpha'\\] sums to"),
                              ("best_primal", state["best_primal"] * 0.9, "'best_primal'.*w_best"),
                              ("model_value", state["model_value"] + 1.0, "'model_value'"),
                              ("oracle_calls", 3, "'oracle_calls'")):
        with pytest.raises(ValueError, match=match):
            BMRM(_table(), lam=0.05).load_state_dict({**state, key: value})


def test_hinge_and_max_of_linear_bundles_are_checked():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 5, generator=g, dtype=torch.float64)
    y = torch.where(x[:, 0] > 0, 1.0, -1.0)
    _fuzz(lambda: BMRM(HingeRisk(x, y), lam=0.1), 4, ("primal", "dual", "gap", "eps"))
    a, b = torch.randn(8, 5, generator=g, dtype=torch.float64), torch.rand(8, generator=g, dtype=torch.float64)
    _fuzz(lambda: OneSlackCuttingPlane(MaxOfLinearRisk(a, b), lam=0.1), 3, ("primal", "dual", "gap", "eps"))


# -- the kernel SSVM ---------------------------------------------------------------------------------

_X, _Y = ts.data.checkers(80, seed=1, dtype=torch.float64)
KERNEL = {
    "exact": dict(sampling="exact", inactive_after=3),
    "linear": dict(sampling="linear", r=20),
    "hybrid": dict(sampling="hybrid", r=30, r_linear=10, patience=1),
}


@pytest.mark.parametrize("name", list(KERNEL))
def test_kernel_cutting_plane_states_are_checked(name):
    def make(x=_X, y=_Y):
        return KernelCuttingPlane(x, y, lam=1.0, gamma=2.0, **KERNEL[name])

    # alpha is the working-set QP's solution to its tolerance (qp_tol eps C = 1e-6): an edit within it is a valid
    # state, whose dual differs by at most that
    counts = _fuzz(make, 5, ("primal", "dual", "gap", "gap_estimate", "violation", "xi"), atol=1e-6)
    assert counts["free"] == 0


def test_kernel_cutting_plane_gram_and_cache_are_recomputed():
    s = KernelCuttingPlane(_X, _Y, lam=1.0, gamma=2.0, sampling="exact")
    for _ in range(3):
        s.step()
    state = s.state_dict()
    G = state["G"].clone()
    G[0, 0] *= 1.001
    with pytest.raises(ValueError, match="'G'.*kernel"):
        KernelCuttingPlane(_X, _Y, lam=1.0, gamma=2.0, sampling="exact").load_state_dict({**state, "G": G})
    cache = state["cache"].clone()
    cache[0, 5] += 1e-3
    with pytest.raises(ValueError, match="'cache'"):
        KernelCuttingPlane(_X, _Y, lam=1.0, gamma=2.0, sampling="exact").load_state_dict({**state, "cache": cache})


def test_kernel_cutting_plane_reports_a_gap_only_for_exact_cuts():
    for sampling, certified in (("exact", True), ("linear", False)):
        s = KernelCuttingPlane(_X, _Y, lam=1.0, gamma=2.0, sampling=sampling, r=20)
        r = s.step()
        assert r["gap_exact"] is certified and r["gap_estimate"] == r["primal"] - r["dual"]
        assert (r["gap"] is not None) is certified
        cert = s.duality_gap()
        assert (cert["gap"] is not None) is certified and cert["gap_estimate"] == cert["primal"] - cert["dual"]


# -- GDMM -------------------------------------------------------------------------------------------

_CHAIN = ts.data.synthetic_chain("train", n=5, num_labels=3, num_features=3, max_length=5, seed=3)


def _gdmm_chain(data=_CHAIN, **kw):
    return GDMM(ts.models.LinearChainModel(3, 3, dtype=torch.float64), data, lam=0.2, rho=1.0,
                structure=Chain(3, normalize=False), **kw)


def _multilabel(edges, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(24, 4, generator=g, dtype=torch.float64)
    y = ((x @ torch.randn(4, 4, generator=g, dtype=torch.float64)
          + 0.8 * torch.randn(24, 4, generator=g, dtype=torch.float64)) > 0).long()
    return MultiLabelProblem(x, y, MultiLabel(4, edges=edges, normalize=False))


def _gdmm_report_is_true(solver, report):
    """The report of a loaded state with other multipliers (or eta_total): its dual is that of the loaded duals,
    and no gap is certified before feasibility."""
    assert math.isclose(report["dual"], -solver.lam * solver.dual_objective(), rel_tol=1e-12, abs_tol=1e-15)
    assert report["gap"] is None or (report["gap_exact"] and report["gap"] >= -1e-9)


GDMM_FREE = {k: _gdmm_report_is_true for k in ("lam_L", "lam_R", "lam1", "lam2", "eta_total")}
GDMMS = {
    "chain": lambda: _gdmm_chain(),
    "chain-eta0-batched": lambda: _gdmm_chain(eta=0.0, batch_size=2, engine="torch"),
    "multilabel-tree": lambda: GDMM(_multilabel([(0, 1), (1, 2), (1, 3)]), lam=1 / 24, rho=1.0),
}


@pytest.mark.parametrize("name", list(GDMMS))
def test_gdmm_states_are_checked(name):
    keys = ("primal", "dual", "gap", "gap_estimate", "lagrangian", "infeasibility")
    _fuzz(GDMMS[name], 3, keys, free=dict(GDMM_FREE))


def test_gdmm_reports_no_certified_gap_before_feasibility():
    for solver in (_gdmm_chain(), GDMM(_multilabel("full"), lam=1 / 24, rho=1.0)):
        for _ in range(5):
            r = solver.step()
        assert r["infeasibility"] > 1e-6
        assert r["gap"] is None and not r["gap_exact"]
        assert r["gap_estimate"] == r["primal"] - r["dual"]
    assert not GDMM(_multilabel("full"), lam=1 / 24)._tight()  # loopy: never a certificate
    assert GDMM(_multilabel([(0, 1), (1, 2), (1, 3)]), lam=1 / 24)._tight()
    # a feasible iterate of a tree certifies: the start (all duals 0) is one
    g = _gdmm_chain()
    assert g._certifies(0.0) and not g._certifies(1e-3)


def test_gdmm_tables_are_recomputed_from_the_duals():
    g = _gdmm_chain()
    for _ in range(3):
        g.step()
    state = g.state_dict()
    for key, match in (("W", "'W'.*duals"), ("v", "'v'.*duals")):
        with pytest.raises(ValueError, match=match):
            _gdmm_chain().load_state_dict({**state, key: state[key] * 1.01})
    uval = state["uval"].clone()
    uval[0, 0] = 2 * g.C
    with pytest.raises(ValueError, match="'uval'.*\\[0, C\\]"):
        _gdmm_chain().load_state_dict({**state, "uval": uval})


# -- the primal solvers ------------------------------------------------------------------------------

_g = torch.Generator().manual_seed(0)
_PX = torch.randn(40, 6, generator=_g, dtype=torch.float64)
_PY = torch.where(_PX[:, 0] + 0.3 * torch.randn(40, generator=_g, dtype=torch.float64) > 0, 1, -1)
_PK = (_PX[:, 0] > 0).long() + (_PX[:, 1] > 0).long()
_L = 1.01 * float(torch.linalg.matrix_norm(_PX, 2)) ** 2 / 0.1  # L_SAFETY ||A||^2 / lam: no Lanczos per solver
_LK = MulticlassPragam(_PX, _PK, 0.1).L


def _pragam_report_is_true(solver, report):
    """Another valid L (above the Lipschitz bound): the run changes, the certificate stays true."""
    assert report["gap"] >= -1e-12 and report["gap"] <= report["bound"] + 1e-12
    assert math.isclose(report["dual"], solver.dual_value(solver.alpha), rel_tol=1e-10)


PRAGAMS = {
    "pragam": lambda X=_PX: Pragam(X, _PY, 0.1, L=_L),
    "pragam-b": lambda X=_PX: Pragam(X, _PY, 0.1, bias=True, L=_L),
    "pragam-sparse": lambda X=_PX: Pragam(X.to_sparse(), _PY, 0.1, L=_L),
    "multiclass": lambda X=_PX: MulticlassPragam(X, _PK, 0.1, L=_LK),
}


@pytest.mark.parametrize("name", list(PRAGAMS))
def test_pragam_states_are_checked(name):
    make = PRAGAMS[name]
    s = make()
    s.step()
    t = make()
    t.load_state_dict(s.state_dict())
    assert t.report() == s.report()
    _fuzz(make, 3, ("primal", "dual", "gap", "bound"), free={"L": _pragam_report_is_true},
          next_report=lambda s: (s.report(), s.step())[1])


def test_pragam_refuses_an_edited_report_and_a_too_small_L():
    s = Pragam(_PX, _PY, 0.1, L=_L)
    s.step()
    state = s.state_dict()
    with pytest.raises(ValueError, match="last_report"):
        Pragam(_PX, _PY, 0.1, L=_L).load_state_dict({**state, "last_report": {**state["last_report"], "gap": 0.0}})
    with pytest.raises(ValueError, match="'L'.*Lipschitz"):
        Pragam(_PX, _PY, 0.1, L=_L).load_state_dict({**state, "L": 1e-6})


def _ssg_report_is_true(solver, report):
    """SSG certifies nothing: an edited iterate is another starting point, its reported primal exact there."""
    assert math.isclose(report["primal"], solver.primal(), rel_tol=1e-12)
    assert report["gap"] is None


def test_ssg_states_are_checked():
    _fuzz(lambda: SSG(_table(), lam=0.05, seed=1), 2, ("primal",),
          free={"w": _ssg_report_is_true, "w_avg": _ssg_report_is_true})
    _fuzz(lambda: SSG(_table(), lam=0.05, seed=1, box=(0.0, None), averaging=False), 2, ("primal",),
          free={"w": _ssg_report_is_true, "w_avg": _ssg_report_is_true})


# -- other data, same sizes --------------------------------------------------------------------------

def _other_chain():
    """The chain data set with its features negated: the same sizes, other data."""
    data = ts.data.synthetic_chain("train", n=5, num_labels=3, num_features=3, max_length=5, seed=3)
    data.x.neg_()
    return data


OTHER_DATA = {
    "bmrm": (lambda: BUNDLES["bmrm-qp"](), lambda: BUNDLES["bmrm-qp"](_table(seed=9))),
    "oneslack": (lambda: BUNDLES["oneslack"](), lambda: BUNDLES["oneslack"](_table(seed=9))),
    "hinge": (lambda: BMRM(HingeRisk(_PX, _PY.double()), lam=0.1),
              lambda: BMRM(HingeRisk(_PX.flip(0), _PY.double()), lam=0.1)),
    "kernel": (lambda: KernelCuttingPlane(_X, _Y, lam=1.0, gamma=2.0, sampling="exact"),
               lambda: KernelCuttingPlane(_X, _Y.flip(0), lam=1.0, gamma=2.0, sampling="exact")),
    "gdmm": (lambda: _gdmm_chain(), lambda: _gdmm_chain(_other_chain())),
    "gdmm-multilabel": (lambda: GDMM(_multilabel("full"), lam=0.05), lambda: GDMM(_multilabel("full", 1), lam=0.05)),
    "pragam": (lambda: PRAGAMS["pragam"](), lambda: PRAGAMS["pragam"](_PX / 2)),  # L stays an upper bound
    "multiclass": (lambda: PRAGAMS["multiclass"](), lambda: PRAGAMS["multiclass"](_PX.flip(0))),
    "ssg": (lambda: SSG(_table(), lam=0.05), lambda: SSG(_table(seed=9), lam=0.05)),
}


@pytest.mark.parametrize("name", list(OTHER_DATA))
def test_a_state_of_other_data_of_the_same_sizes_is_refused(name):
    make, make_other = OTHER_DATA[name]
    source = make()
    source.step()
    state = source.state_dict()
    assert "fingerprint" in state
    with pytest.raises(ValueError, match="other training data"):
        make_other().load_state_dict(state)
    with pytest.raises(ValueError, match="fingerprint"):
        make().load_state_dict({k: v for k, v in state.items() if k != "fingerprint"})


# -- non-finite data and NaN reports -----------------------------------------------------------------


def test_non_finite_data_are_refused_up_front():
    x = _PX.clone()
    x[3, 1] = math.nan
    for build, match in ((lambda: HingeRisk(x, _PY.double()), "x contains NaN"),
                         (lambda: MaxOfLinearRisk(x), "a contains NaN"),
                         (lambda: MaxOfLinearRisk(_PX, torch.full((40,), math.inf, dtype=torch.float64)),
                          "b contains Inf"),
                         (lambda: BMRM(HingeRisk(x, _PY.double())), "NaN"),
                         (lambda: KernelCuttingPlane(x, _PY, lam=1.0), "NaN"),
                         (lambda: Pragam(x, _PY, 0.1), "NaN"),
                         (lambda: MulticlassPragam(x, _PK, 0.1), "NaN"),
                         (lambda: GDMM(MultiLabelProblem(x[:, :4], (x[:, :4] > 0).long(), MultiLabel(4)), lam=0.1),
                          "NaN")):
        with pytest.raises(ValueError, match=match):
            build()
    chain = ts.data.synthetic_chain("train", n=5, num_labels=3, num_features=3, max_length=5, seed=3)
    chain.x[0, 0, 0] = math.nan
    for cls in (BMRM, OneSlackCuttingPlane, SSG, GDMM):
        with pytest.raises(ValueError, match="NaN"):
            cls(ts.models.LinearChainModel(3, 3, dtype=torch.float64), chain, lam=0.1)


class _NaNRisk:
    """A risk oracle (duck-typed) whose value and cut are NaN: what a broken user oracle returns."""

    n, d, device, calls = 1, 3, torch.device("cpu"), 0

    def initial_w(self):
        return torch.zeros(3, dtype=torch.float64)

    def write_model(self, w):
        pass

    def cut(self, w):
        return math.nan, math.nan, torch.full((3,), math.nan, dtype=torch.float64)


@pytest.mark.parametrize("cls", [BMRM, OneSlackCuttingPlane])
def test_converged_is_never_true_on_nan(cls):
    s = cls(_NaNRisk(), lam=0.1)
    r = s.step()
    assert math.isnan(r["primal"]) and r["converged"] is False


def test_pegasos_refuses_another_objective_a_negative_count_and_a_float32_average():
    from torchssvm.optim import Pegasos

    w = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    opt = Pegasos([w], lam=0.1, average=True)
    for _ in range(3):
        opt.zero_grad()
        (w.sum() ** 2).backward()
        opt.step()
    state = opt.state_dict()
    group = state["param_groups"][0]
    average = state["state"][0]["average"]
    for edited, match in (({**state, "param_groups": [{**group, "lam": 0.2}]}, "'lam'"),
                          ({**state, "param_groups": [{**group, "t": -1}]}, "'t'"),
                          ({**state, "state": {0: {"average": average.float()}}}, "average"),
                          ({**state, "state": {0: {"average": average * math.nan}}}, "NaN")):
        target = Pegasos([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], lam=0.1, average=True)
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(edited)
        assert target.state_dict()["param_groups"][0].get("t", 0) == 0  # unchanged
    target = Pegasos([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], lam=0.1, average=True)
    target.load_state_dict(state)
    assert target.param_groups[0]["t"] == 3
