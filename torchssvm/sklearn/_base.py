"""What the dual estimators share: parameter checks done in ``fit``, the BCFW run with warm start, the seed."""

from __future__ import annotations

import hashlib
import math
import numbers

import numpy as np
from sklearn.utils import check_random_state

from ..optim.frank_wolfe import BCFW, FrankWolfe

SOLVERS = ("bcfw", "fw")
# "auto" batch size of BCFW: a mini-batch of this many distinct blocks per step (one batched oracle call and the
# exact box-QP step); batch_size=1 is the paper's algorithm, step for step, and much slower per pass in Python
AUTO_BATCH = 16


def check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def data_digest(*arrays) -> str:
    """A digest of the training data: warm start continues only on the same data."""
    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def seed_of(random_state) -> int:
    """The solver's integer seed from a scikit-learn ``random_state``."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


class DualEstimatorMixin:
    """`fit` helpers of the estimators over BCFW / batch Frank-Wolfe (parameters ``lam``, ``max_passes``,
    ``gap_tol``, ``sampling``, ``step``, ``cache_size``, ``gap_check_every``, ``batch_size``, ``warm_start``,
    ``random_state`` and optionally ``solver``)."""

    def _check_dual_params(self):
        check_positive("lam", self.lam)
        mp = self.max_passes
        if isinstance(mp, bool) or not isinstance(mp, numbers.Real) or not (mp > 0 and math.isfinite(mp)):
            raise ValueError(f"max_passes must be a finite number > 0, got {mp!r}")
        if self.gap_tol is not None:
            if isinstance(self.gap_tol, bool) or not isinstance(self.gap_tol, numbers.Real) or not self.gap_tol >= 0:
                raise ValueError(f"gap_tol must be a number >= 0 or None, got {self.gap_tol!r}")
        if getattr(self, "solver", "bcfw") not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        if self.batch_size != "auto":
            check_int("batch_size", self.batch_size, 1)

    def _solver_config(self) -> tuple:
        return (getattr(self, "solver", "bcfw"), float(self.lam), self.sampling, self.step, self.cache_size,
                self.gap_check_every, self.batch_size)

    def _run_dual(self, make_problem, digest: str):
        """Build the solver on ``make_problem()`` (or keep the last one: ``warm_start`` on the same data and
        settings), run ``fit(max_passes, gap_tol)``, then set ``gap_``, ``primal_``, ``dual_``, ``n_iter_`` (effective
        passes from the start of training). Returns the solver."""
        self._check_dual_params()
        key = (digest, self._solver_config())
        solver = getattr(self, "_solver", None)
        if not (self.warm_start and solver is not None and getattr(self, "_solver_key", None) == key):
            problem = make_problem()
            if getattr(self, "solver", "bcfw") == "fw":
                solver = FrankWolfe(problem, lam=float(self.lam))
            else:
                batch = min(problem.n, AUTO_BATCH) if self.batch_size == "auto" else min(self.batch_size, problem.n)
                solver = BCFW(problem, lam=float(self.lam), sampling=self.sampling, step=self.step,
                              cache_size=self.cache_size, gap_check_every=self.gap_check_every, batch_size=batch,
                              seed=seed_of(self.random_state))
            self._solver, self._solver_key = solver, key
        solver.fit(max_passes=self.max_passes, gap_tol=self.gap_tol)
        cert = solver.duality_gap()
        self.gap_, self.primal_, self.dual_ = cert["gap"], cert["primal"], cert["dual"]
        self.n_iter_ = solver.oracle_calls / solver.n
        return solver

    def __getstate__(self):
        # the solver (its problem holds a copy of the training data) is not pickled: a warm start after unpickling
        # starts a new run
        state = super().__getstate__()  # BaseEstimator's: a copy of __dict__ with the scikit-learn version
        state.pop("_solver", None)
        state.pop("_solver_key", None)
        return state
