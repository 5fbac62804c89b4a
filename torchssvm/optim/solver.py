"""The contract every solver of `torchssvm.optim` follows (the role ``torch.optim.Optimizer`` plays for gradient
methods): `Solver`.

A solver implements `Solver.step` (one iteration or pass; returns its report, a dict) and declares:

- ``limit_name`` (``"max_iter"`` or ``"max_passes"``): the public keyword of its progress limit, and `_progress`,
  the measure that limit counts from the start of training (iterations, or effective passes ``oracle_calls / n``);
  ``limit_integer`` when the limit must be an int, ``limit_relative`` when it counts from the call (SSG's "this many
  more passes"), ``requires_limit`` when `fit` without any limit is an error (False: it runs to the solver's own
  stopping rule, a report's ``converged``);
- ``report_keys``: the report entries logged as TensorBoard scalars under ``tag`` (`_log`); `_log_step` and
  `_log_extra` for the step number and anything beyond scalars (a histogram);
- ``_state_tensors``, ``_state_scalars`` and `_config` (the settings of the objective a state is bound to): the
  `state_dict` / `load_state_dict` pair; `_extra_state`, `_checked_state`, `_set_state` extend them with what a
  solver adds;
- optionally `_certify` (an exact gap pass, for solvers whose reports carry gap estimates), `_done` (a solver's own
  stopping rule beyond ``converged`` and ``gap_tol``) and `_after_fit` (what the model holds after a fit).

The base owns the loop (`_fit`, behind each family's `fit` signature): the argument checks, "the limit is already
met: no step", the step, the certifying exact pass when an estimate says done, the callback, the stops, and a
`ConvergenceWarning` when a tolerance was asked for and a limit or the time budget stopped the run short of it.
"""

from __future__ import annotations

import warnings
from typing import Optional

from ._state import check_config, checked_scalars, checked_tensor, require_keys
from .loop import check_limits, log_scalars


class ConvergenceWarning(UserWarning):
    """A `fit` given a tolerance (``gap_tol``, GDMM's ``infeasibility_tol``) was stopped by its iteration / pass
    limit or its time budget before reaching it (scikit-learn's warning of the same name and meaning). The solver's
    state is valid: ``fit`` again, with a larger limit, continues the run."""


class Solver:
    """Base of the solvers: `step` returns the report; `fit` loops; `state_dict` / `load_state_dict` resume.

    See the module docstring for what a subclass declares. ``fit`` returns the list of step reports."""

    tag = "solver"
    limit_name = "max_iter"
    limit_integer = False
    limit_relative = False
    requires_limit = True
    report_keys: tuple = ()
    _state_tensors: tuple = ()
    _state_scalars: tuple = ()
    writer = None
    seconds = 0.0
    # fit(gap_tol=...) sets it: a solver whose step measures the gap of w and then moves w keeps w in the pass that
    # certifies the gap, so that the model holds the certified iterate (the dual solvers read it)
    _hold_below: Optional[float] = None

    # -- what a solver implements ----------------------------------------------------------------
    def step(self) -> dict:
        """One iteration (or pass); returns its report."""
        raise NotImplementedError

    def _progress(self) -> float:
        """What ``limit_name`` counts, from the start of training."""
        raise NotImplementedError

    def _certify(self) -> Optional[dict]:
        """An exact gap pass (counted in the solver's work) as report entries, or None: no estimates to certify."""
        return None

    def _done(self, report: dict, limits: dict, exact: bool) -> bool:
        """Whether ``report`` ends the run short of the limits: the solver's own rule (``converged``) or a gap at
        most ``gap_tol`` (exact, unless ``exact=False``)."""
        if report.get("converged"):
            return True
        gap_tol, gap = limits.get("gap_tol"), report.get("gap")
        return gap_tol is not None and gap is not None and gap <= gap_tol and (bool(report.get("gap_exact"))
                                                                               or not exact)

    def _after_fit(self) -> None:
        """Called at the end of a `fit` that took a step (e.g. write the certified iterate to the model)."""

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self, max_iter: Optional[int] = None, gap_tol: Optional[float] = None,
            time_budget: Optional[float] = None, callback=None, *, exact: bool = True) -> list:
        """Call `step` until ``max_iter`` iterations (from the start of training), a gap ``<= gap_tol`` (exact:
        a certificate, unless ``exact=False``), ``time_budget`` seconds of solver time, or the solver's own
        stopping rule. Returns the reports; ``callback(report)`` after each. See `_fit`."""
        return self._fit({"max_iter": max_iter, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback, exact=exact)

    def _fit(self, limits: dict, *, callback=None, exact: bool = True) -> list:
        """The one loop behind every `fit`. ``limits`` maps the public keywords of the solver's `fit`, in order, to
        their values: ``limit_name`` (the progress limit), ``"gap_tol"``, ``"time_budget"`` and any tolerance the
        solver's `_done` reads.

        Each is None or a number ``>= 0`` (`check_limits`); with ``requires_limit``, at least one is given. A
        progress limit already met runs no step. After each step: when an estimated gap is at most
        ``0.8 gap_tol`` (and ``exact``), the exact pass `_certify` replaces it; the callback; then the stops, in
        this order: `_done` (``converged``, the tolerances), the progress limit, the time budget. A run that a
        limit or the time budget stopped while a tolerance was given warns (`ConvergenceWarning`). While it runs,
        ``_hold_below`` is ``gap_tol``."""
        names = tuple(limits)
        if self.requires_limit and all(v is None for v in limits.values()):
            raise ValueError(f"fit needs at least one of {', '.join(names)}")
        check_limits(integer=(self.limit_name,) if self.limit_integer else (), **limits)
        limit, gap_tol, budget = limits.get(self.limit_name), limits.get("gap_tol"), limits.get("time_budget")
        tolerances = [k for k, v in limits.items() if v is not None and k not in (self.limit_name, "time_budget")]
        if limit is not None and self.limit_relative:
            limit = self._progress() + limit
        history = []
        if limit is not None and self._progress() >= limit:
            return history  # the limit counts from the start of training: already met, no step
        self._hold_below = gap_tol
        done = False
        try:
            while True:
                r = self.step()
                if gap_tol is not None and exact and not r.get("gap_exact") and r.get("gap") is not None \
                        and r["gap"] <= 0.8 * gap_tol:
                    certificate = self._certify()  # a cheap estimate says done: confirm with an exact pass
                    if certificate is not None:
                        r = {**r, **certificate}
                        self._log(r)  # the certificate (and its work) at the step the estimate was logged
                history.append(r)
                if callback is not None:
                    callback(r)
                if self._done(r, limits, exact):
                    done = True
                    break
                if limit is not None and self._progress() >= limit:
                    break
                if budget is not None and self.seconds >= budget:
                    break
        finally:
            self._hold_below = None
        self._after_fit()
        if tolerances and not done:
            which = " and ".join(f"{k} = {limits[k]!r}" for k in tolerances)
            by = self.limit_name if limit is not None and self._progress() >= limit else "time_budget"
            warnings.warn(f"{type(self).__name__}.fit stopped by {by} before reaching {which} (last gap "
                          f"{history[-1].get('gap')!r}); fit again with a larger limit to go on",
                          ConvergenceWarning, stacklevel=3)
        return history

    # -- logging ----------------------------------------------------------------------------------
    def _log(self, report: dict) -> None:
        """The finite ``report_keys`` entries of ``report`` as scalars ``{tag}/{key}`` at `_log_step`, then
        `_log_extra`; nothing without a ``writer``."""
        if self.writer is None:
            return
        step = self._log_step(report)
        log_scalars(self.writer, self.tag, report, self.report_keys, step)
        self._log_extra(report, step)

    def _log_step(self, report: dict) -> int:
        return self.steps_done

    def _log_extra(self, report: dict, step: int) -> None:
        """What a solver logs beyond the scalars of ``report_keys``."""

    # -- state ------------------------------------------------------------------------------------
    def _config(self) -> dict:
        """The settings of the objective that a state is bound to (`_state.check_config`)."""
        return {}

    def _extra_state(self) -> dict:
        """Entries a solver adds to `state_dict` beyond the declared ones. Called first: a solver may settle
        counters there that the declared scalars then read."""
        return {}

    def state_dict(self) -> dict:
        """The declared state tensors (copies) and scalars, the configuration `_config`, and `_extra_state`."""
        extra = self._extra_state()
        s = {k: getattr(self, k).clone() for k in self._state_tensors}
        s.update({k: getattr(self, k) for k in self._state_scalars})
        s.update(self._config())
        s.update(extra)
        return s

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict`: the run continues the same trajectory. A state of other sizes, or saved under
        another configuration (`_config`), raises a ValueError and leaves the solver unchanged: everything is
        checked (`_checked_state`) before anything is set (`_set_state`)."""
        self._set_state(self._checked_state(state))

    def _state_shape(self, key: str, state: dict) -> tuple:
        """The shape state tensor ``key`` must have (default: the current one's)."""
        return tuple(getattr(self, key).shape)

    def _scalar_types(self) -> dict:
        """``{name: int / float / bool}`` of the declared scalars (default: their current types)."""
        return {k: type(getattr(self, k)) for k in self._state_scalars}

    def _checked_state(self, state: dict) -> dict:
        """The attributes to set from ``state``, all checked (subclasses add theirs); nothing is set here."""
        require_keys(state, (*self._state_tensors, *self._state_scalars))
        check_config(state, self._config())
        out = {k: checked_tensor(state, k, self._state_shape(k, state), getattr(self, k))
               for k in self._state_tensors}
        out.update(checked_scalars(state, self._scalar_types()))
        return out

    def _set_state(self, checked: dict) -> None:
        for k, value in checked.items():
            setattr(self, k, value)
