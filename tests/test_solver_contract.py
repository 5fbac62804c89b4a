"""The solver contract (`torchssvm.optim.solver.Solver`): every solver is one, shares the loop, the state checks and
the logging, and the loop behaves as documented."""

import inspect
import math
import warnings

import pytest
import torch

import torchssvm as ts
from torchssvm import optim
from torchssvm.optim import ConvergenceWarning, Solver

# solvers still on their own loop (moved one family at a time)
NOT_YET = set()
SHARED = ("_fit", "state_dict", "load_state_dict", "_checked_state", "_log")


def _solver_classes():
    out = []
    for name in optim.__all__:
        obj = getattr(optim, name)
        if inspect.isclass(obj) and callable(getattr(obj, "step", None)) and obj is not optim.Pegasos \
                and obj is not Solver:
            out.append(obj)
    return out


def test_the_exported_solvers_are_found():
    names = {c.__name__ for c in _solver_classes()}
    assert names == {"BCFW", "FrankWolfe", "NSlackCuttingPlane", "DualSolver", "BMRM", "OneSlackCuttingPlane", "GDMM",
                     "MultiLabelGDMM", "Pragam", "MulticlassPragam", "SSG", "KernelCuttingPlane"}
    assert ts.ConvergenceWarning is ConvergenceWarning and issubclass(ConvergenceWarning, UserWarning)


@pytest.mark.parametrize("cls", _solver_classes(), ids=lambda c: c.__name__)
def test_every_solver_is_a_solver_and_keeps_the_shared_parts(cls):
    if cls.__name__ in NOT_YET:
        pytest.skip("not on the contract yet")
    assert issubclass(cls, Solver)
    for name in SHARED:
        if name == "_checked_state":
            continue  # extended by solvers that add state, through super()
        assert getattr(cls, name) is getattr(Solver, name), f"{cls.__name__} overrides {name}"
    # a family's fit only names its public keywords and hands them to the one loop
    if cls.fit is not Solver.fit:
        assert set(cls.fit.__code__.co_names) == {"_fit"}, f"{cls.__name__}.fit does more than call Solver._fit"
    for name in ("_checked_state", "_set_state"):
        method = getattr(cls, name)
        if method is not getattr(Solver, name):
            assert "super" in method.__code__.co_names, f"{cls.__name__}.{name} does not extend the base's"


# -- the loop on a toy solver: deterministic, no oracle --------------------------------------------------------------
class Toy(Solver):
    """Gap ``1 / (k + 1)`` after step k, an estimate (``0.5 x`` the exact one) except every ``exact_every`` steps."""

    tag = "toy"
    limit_name = "max_passes"
    report_keys = ("gap", "passes")
    _state_tensors = ("x",)
    _state_scalars = ("k", "seconds")

    def __init__(self, exact_every=1, converge_at=None, lam=1.0):
        self.k, self.seconds, self.exact_every, self.converge_at, self.lam = 0, 0.0, exact_every, converge_at, lam
        self.x = torch.zeros(3, dtype=torch.float64)
        self.certified, self.held = 0, []
        self.steps_done = 0

    def _progress(self):
        return self.k

    def _config(self):
        return {"lam": self.lam}

    def step(self):
        self.held.append(self._hold_below)
        self.k += 1
        self.steps_done = self.k
        self.seconds += 1.0
        self.x += 1
        exact = self.k % self.exact_every == 0
        gap = 1.0 / (self.k + 1) * (1.0 if exact else 0.5)
        r = {"gap": gap, "gap_exact": exact, "passes": float(self.k), "converged": self.k == self.converge_at}
        self._log(r)
        return r

    def _certify(self):
        self.certified += 1
        return {"gap": 1.0 / (self.k + 1), "gap_exact": True}

    def fit(self, max_passes=None, gap_tol=None, time_budget=None, *, exact=True, callback=None):
        return self._fit({"max_passes": max_passes, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback, exact=exact)


def _no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return fn()


def test_loop_checks_its_arguments():
    s = Toy()
    with pytest.raises(ValueError, match="fit needs at least one of max_passes, gap_tol, time_budget"):
        s.fit()
    with pytest.raises(ValueError, match="max_passes must be >= 0"):
        s.fit(max_passes=-1)
    with pytest.raises(TypeError, match="gap_tol must be a number"):
        s.fit(gap_tol="0.1")
    assert s.k == 0


def test_limit_counts_from_the_start_and_an_already_met_limit_takes_no_step():
    s = Toy()
    assert len(s.fit(max_passes=3)) == 3
    assert s.fit(max_passes=3) == [] and s.k == 3
    assert len(s.fit(max_passes=5)) == 2


def test_gap_tol_stops_on_an_exact_gap_only_and_certifies_estimates():
    s = Toy(exact_every=100)
    hist = _no_warning(lambda: s.fit(max_passes=50, gap_tol=0.1))
    # the estimate 0.5 / (k + 1) <= 0.08 from k = 6 on: certified there, exact 1/(k+1) <= 0.1 from k = 9
    assert hist[-1]["gap_exact"] and hist[-1]["gap"] <= 0.1 and s.k == 9
    assert s.certified == 4
    assert all(not r["gap_exact"] for r in hist[:5])
    s2 = Toy(exact_every=100)
    hist = _no_warning(lambda: s2.fit(max_passes=50, gap_tol=0.1, exact=False))
    assert s2.k == 4 and not hist[-1]["gap_exact"] and s2.certified == 0  # the estimate 0.5 / 5 is accepted
    assert all(h == 0.1 for h in s.held) and s._hold_below is None  # gap_tol held during the fit, then cleared


def test_callback_sees_every_report_and_time_budget_stops():
    s, seen = Toy(), []
    hist = s.fit(time_budget=2.5, callback=seen.append)
    assert seen == hist and s.k == 3  # solver seconds: 1 a step
    assert len(Toy().fit(time_budget=0)) == 1


def test_converged_stops_without_a_warning():
    s = Toy(converge_at=2)
    hist = _no_warning(lambda: s.fit(max_passes=10, gap_tol=1e-9))
    assert len(hist) == 2 and hist[-1]["converged"]


def test_convergence_warning_exactly_when_a_limit_stops_short_of_gap_tol():
    with pytest.warns(ConvergenceWarning, match="max_passes before reaching gap_tol"):
        Toy().fit(max_passes=2, gap_tol=1e-3)
    with pytest.warns(ConvergenceWarning, match="time_budget before reaching gap_tol"):
        Toy().fit(time_budget=2, gap_tol=1e-3)
    _no_warning(lambda: Toy().fit(max_passes=2))  # no tolerance asked for
    _no_warning(lambda: Toy().fit(max_passes=100, gap_tol=0.1))  # reached
    s = Toy()
    s.fit(max_passes=2)
    _no_warning(lambda: s.fit(max_passes=2))  # no step taken, no tolerance asked for
    with pytest.warns(ConvergenceWarning, match="took no step: max_passes = 2 is already reached"):
        assert len(s.fit(max_passes=2, gap_tol=1e-3)) == 0  # no step taken: the tolerance is not checked


def test_state_round_trip_and_refusal_leaves_the_solver_unchanged():
    a = Toy()
    a.fit(max_passes=3)
    state = a.state_dict()
    assert set(state) == {"x", "k", "seconds", "lam", "state_version"}
    b = Toy()
    b.load_state_dict(state)
    assert b.k == 3 and torch.equal(b.x, a.x) and b.x is not a.x
    assert b.step() == a.step()
    c = Toy(lam=2.0)
    with pytest.raises(ValueError, match="lam"):
        c.load_state_dict(state)
    bad = {**state, "x": torch.zeros(4, dtype=torch.float64)}
    with pytest.raises(ValueError, match="x"):
        Toy().load_state_dict(bad)
    bad = {**state, "k": 2.5}
    d = Toy()
    with pytest.raises(ValueError, match="k"):
        d.load_state_dict(bad)
    assert d.k == 0 and torch.equal(d.x, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="missing"):
        Toy().load_state_dict({"x": state["x"]})


class Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def add_histogram(self, tag, values, step):
        self.scalars.append((tag, "hist", step))


def test_logging_from_report_keys():
    s = Toy()
    s.writer = Writer()
    s.fit(max_passes=2)
    assert s.writer.scalars == [("toy/gap", 0.5, 1), ("toy/passes", 1.0, 1), ("toy/gap", 1 / 3, 2),
                                ("toy/passes", 2.0, 2)]


# -- the loop on real solvers ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chain():
    ds = ts.data.synthetic_chain("train", 40, num_labels=4, num_features=6, seed=0)
    return ds


def _model(ds):
    return ts.LinearChainModel(6, 4)


def test_bcfw_fit_certifies_and_warns_short(chain):
    s = optim.BCFW(_model(chain), chain, lam=1.0, gap_check_every=0, batch_size=4, backend="torch")
    hist = _no_warning(lambda: s.fit(max_passes=30, gap_tol=0.3))
    assert hist[-1]["gap_exact"] and hist[-1]["gap"] <= 0.3  # estimates only: the last one certified
    assert not any(r["gap_exact"] for r in hist[:-1])
    assert s.fit(max_passes=1) == []
    with pytest.warns(ConvergenceWarning, match="BCFW.fit stopped by max_passes"):
        s.fit(max_passes=s.oracle_calls / s.n + 1, gap_tol=1e-12)
    with pytest.raises(ValueError, match="fit needs at least one of max_passes, gap_tol, time_budget"):
        s.fit()


@pytest.mark.parametrize("make", [
    lambda m, ds: optim.FrankWolfe(m, ds, lam=0.1, backend="torch"),
    lambda m, ds: optim.BCFW(m, ds, lam=0.1, step="pairwise", cache_size=4, batch_size=4, seed=3, backend="torch"),
    lambda m, ds: optim.NSlackCuttingPlane(m, ds, lam=0.1, eps=1e-4, backend="torch"),
    lambda m, ds: optim.BMRM(m, ds, lam=0.1, backend="torch"),
    lambda m, ds: optim.OneSlackCuttingPlane(m, ds, lam=0.1, eps=1e-4, backend="torch"),
], ids=["fw", "bcfw", "nslack", "bmrm", "oneslack"])
def test_state_round_trip_on_real_solvers(chain, make):
    a = make(_model(chain), chain)
    a.fit(max_passes=2)
    state = a.state_dict()
    b = make(_model(chain), chain)
    b.load_state_dict(state)
    ra, rb = a.step(), b.step()
    for key in ("primal", "dual", "gap", "passes"):
        assert ra[key] == pytest.approx(rb[key], rel=1e-12, abs=1e-15), key
    c = make(_model(chain), chain)
    c.lam = 0.2  # another objective: refused, nothing set
    before = {k: v.clone() for k, v in c.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match="lam"):
        c.load_state_dict(state)
    after = c.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_solver_logs_its_report_keys(chain):
    s = optim.FrankWolfe(_model(chain), chain, lam=0.1, backend="torch")
    s.writer = Writer()
    s.fit(max_passes=1)
    tags = {t for t, _, _ in s.writer.scalars}
    assert {f"fw/{k}" for k in ("primal", "dual", "gap", "passes", "oracle_calls", "time")} <= tags
    assert "fw/exact_gap" in tags and "fw/block_gaps" in tags


def test_an_estimate_is_never_logged_under_a_certified_tag(chain):
    s = optim.BCFW(_model(chain), chain, lam=0.1, gap_check_every=3, backend="torch")
    s.writer = Writer()
    reports = s.fit(max_passes=6)
    logged = {}
    for tag, value, step in s.writer.scalars:
        logged.setdefault(tag, {})[step] = value
    exact = {r["passes"]: r for r in reports if r["gap_exact"]}
    estimated = [r for r in reports if not r["gap_exact"] and math.isfinite(r["gap"])]  # inf: not all seen yet
    assert exact and estimated
    # every value under bcfw/gap and bcfw/primal is an exact pass's; the estimates are under *_estimate
    assert set(logged["bcfw/gap"]) == set(logged["bcfw/primal"])
    assert len(logged["bcfw/gap"]) == len(exact) and len(logged["bcfw/gap_estimate"]) == len(estimated)
    assert sorted(logged["bcfw/gap"].values()) == sorted(r["gap"] for r in exact.values())
    assert sorted(logged["bcfw/gap_estimate"].values()) == sorted(r["gap"] for r in estimated)


# -- one regularization name: lam (C forms convert exactly) ----------------------------------------------------------
def test_gdmm_lam_and_the_equivalent_C_give_the_same_iterates():
    ds = ts.data.synthetic_chain("train", 8, num_labels=3, num_features=4, max_length=4, seed=1)
    lam = 0.05
    a = optim.GDMM(ts.LinearChainModel(4, 3), ds, lam=lam, rho=0.5, primal_every=0, engine="torch")
    b = optim.GDMM.from_C(ts.LinearChainModel(4, 3), ds, C=1.0 / (lam * 8), rho=0.5, primal_every=0, engine="torch")
    assert a.lam == lam and b.C == a.C and b.lam == pytest.approx(lam, rel=1e-15)
    for _ in range(3):
        ra, rb = a.step(), b.step()
    assert torch.equal(a.W, b.W) and torch.equal(a.v, b.v) and ra["dual"] == pytest.approx(rb["dual"], rel=1e-14)
    with pytest.warns(DeprecationWarning, match="lam = 1 / \\(C n\\)"):
        c = optim.GDMM(ts.LinearChainModel(4, 3), ds, C=1.0 / (lam * 8), rho=0.5, primal_every=0, engine="torch")
    assert c.C == a.C
    with pytest.raises(ValueError, match="lam or C"):
        optim.GDMM(ts.LinearChainModel(4, 3), ds, lam=lam, C=1.0)
    default = optim.GDMM(ts.LinearChainModel(4, 3), ds, primal_every=0)
    assert default.C == 1.0 and default.lam == 1.0 / 8  # the former default C = 1
    with pytest.warns(ConvergenceWarning, match="max_iter before reaching infeasibility_tol"):
        a.fit(max_iter=4, infeasibility_tol=1e-12)


def test_multilabel_gdmm_lam_and_the_equivalent_C_give_the_same_iterates():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    y = (x @ torch.randn(3, 3, generator=gen, dtype=torch.float64) > 0).long()
    problem = optim.MultiLabelProblem(x, y, ts.MultiLabel(3, edges="full", normalize=False))
    a = optim.GDMM(problem, lam=0.1, primal_every=0)
    b = optim.GDMM.from_C(problem, C=1.0 / (0.1 * 12), primal_every=0)
    assert type(a) is type(b) is optim.MultiLabelGDMM and a.C == b.C
    for _ in range(2):
        a.step(), b.step()
    assert torch.equal(a.a, b.a) and torch.equal(a.W, b.W)


# -- Pragam, SSG ----------------------------------------------------------------------------------------------------
def _xy(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.where(x[:, 0] + 0.3 * torch.randn(n, generator=g, dtype=torch.float64) > 0, 1, -1)
    return x, y


def test_pragam_runs_the_shared_loop():
    x, y = _xy()
    s = optim.Pragam(x, y, 0.1)
    assert type(s).fit is Solver.fit
    hist = _no_warning(lambda: s.fit(max_iter=500, gap_tol=1e-2))
    assert hist[-1]["gap"] <= 1e-2 and s.fit(max_iter=1) == []
    with pytest.warns(ConvergenceWarning, match="max_iter before reaching gap_tol"):
        s.fit(max_iter=s.iteration + 1, gap_tol=1e-14)
    with pytest.raises(TypeError, match="max_iter must be an int"):
        s.fit(max_iter=2.5)
    t = optim.Pragam(x, y, 0.1)
    t.load_state_dict(s.state_dict())
    assert t.step()["gap"] == s.step()["gap"]


def test_ssg_limit_counts_from_the_call_and_its_state_round_trips(chain):
    a = optim.SSG(_model(chain), chain, lam=0.1, seed=0, backend="torch")
    assert len(a.fit(2)) == 2 and len(a.fit(1)) == 1 and a.steps_done == 3  # max_passes more passes
    assert a.fit(0) == []
    with pytest.raises(ValueError, match="max_passes must be >= 0"):
        a.fit(-1)
    b = optim.SSG(_model(chain), chain, lam=0.1, seed=5, backend="torch")
    b.load_state_dict(a.state_dict())
    assert a.step()["primal"] == b.step()["primal"]


# -- KernelCuttingPlane ---------------------------------------------------------------------------------------------
def test_kernel_cutting_plane_lam_and_the_equivalent_C_give_the_same_iterates():
    x, y = _xy()
    a = optim.KernelCuttingPlane(x, y, lam=0.25, gamma=0.5, sampling="exact", eps=1e-3)
    b = optim.KernelCuttingPlane.from_C(x, y, 4.0, gamma=0.5, sampling="exact", eps=1e-3)
    assert a.C == b.C == 4.0 and a.lam == b.lam == 0.25
    ha, hb = a.fit(max_iter=5), b.fit(max_iter=5)
    assert torch.equal(a.alpha, b.alpha) and [r["dual"] for r in ha] == [r["dual"] for r in hb]
    with pytest.warns(DeprecationWarning, match="lam = 1 / C"):
        c = optim.KernelCuttingPlane(x, y, 4.0, gamma=0.5, sampling="exact")
    assert c.C == 4.0 and c.lam == 0.25
    with pytest.raises(ValueError, match="lam or C"):
        optim.KernelCuttingPlane(x, y, 4.0, lam=0.25)
    assert optim.KernelCuttingPlane(x, y, gamma=0.5).C == 1.0  # the former default
    assert a.fit(max_iter=a.steps_done) == []  # already met
