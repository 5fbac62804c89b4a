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
- ``_state_tensors``, ``_state_scalars``, `_config` (the settings of the objective a state is bound to) and `_data`
  (the training data it is bound to, recorded as a fingerprint): the `state_dict` / `load_state_dict` pair;
  `_extra_state`, `_checked_state`, `_set_state` extend them with what a solver adds, and `_check_consistency`
  recomputes from a loaded state what can be recomputed without an oracle (a state is checked, not trusted);
- optionally `_certify` (an exact gap pass, for solvers whose reports carry gap estimates), `_done` (a solver's own
  stopping rule beyond ``converged`` and ``gap_tol``) and `_after_fit` (what the model holds after a fit).

The base owns the loop (`_fit`, behind each family's `fit` signature): the argument checks, "the limit is already
met: no step", the step, the certifying exact pass when an estimate says done, the callback, the stops, a
`ConvergenceWarning` when a tolerance was asked for and a limit or the time budget stopped the run short of it, and
checkpoints (``fit(checkpoint=PATH)``: resume from PATH when it exists, write it atomically every
``checkpoint_every`` steps and at the end; `torchssvm.optim.checkpoint`).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Optional, Union

import torch

from ._state import check_config, checked_scalars, checked_tensor, require_keys
from .checkpoint import resume_from, save_checkpoint
from .fingerprint import fingerprint
from .history import History
from .loop import check_limits, log_scalars


class ConvergenceWarning(UserWarning):
    """A `fit` given a tolerance (``gap_tol``, GDMM's ``infeasibility_tol``) was stopped by its iteration / pass
    limit or its time budget before reaching it (scikit-learn's warning of the same name and meaning). The solver's
    state is valid: ``fit`` again, with a larger limit, continues the run."""


# What `Solver.state_dict` records, by version. 2: the structure's settings in the fingerprint, the
# seals of z (where its constraints are necessary only) and of the bundle methods' cuts, the bundle methods'
# rescaling. A state of version 1 records less: some load as before, the others are refused (`explain_older_state`).
STATE_VERSION = 2


def explain_older_state(state, err: ValueError) -> ValueError:
    """``err`` (the refusal of ``state``), with the reason added where ``state`` was saved before `STATE_VERSION`
    (it has no ``"state_version"``): its fingerprint or seals may be missing or computed over less, which the
    error alone would present as other data or an edit."""
    if isinstance(state, dict) and "state_version" not in state:
        return ValueError(f"{err} (this state was saved by a torchssvm older than state version {STATE_VERSION}, "
                          "whose states record less: resume it with that torchssvm, or train again)")
    return err


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
    _writer = None
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

    def _resume_checkpoint(self, checkpoint, every: int) -> None:
        """``fit(checkpoint=...)``'s resume: check the arguments and load the state when the file exists
        (`resume_from`). Solvers whose state is not one file (one per rank) override it with `_save_checkpoint`."""
        resume_from(self, checkpoint, every)

    def _save_checkpoint(self, checkpoint) -> None:
        """``fit(checkpoint=...)``'s write: the state, atomically (`save_checkpoint`)."""
        save_checkpoint(self.state_dict(), checkpoint)

    def _after_fit(self) -> None:
        """Called at the end of a `fit` that took a step (e.g. write the certified iterate to the model)."""

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self, max_iter: Optional[int] = None, gap_tol: Optional[float] = None,
            time_budget: Optional[float] = None, callback=None, *, exact: bool = True,
            checkpoint: Union[str, os.PathLike, None] = None, checkpoint_every: int = 1) -> list:
        """Call `step` until ``max_iter`` iterations (from the start of training), a gap ``<= gap_tol`` (exact:
        a certificate, unless ``exact=False``), ``time_budget`` seconds of solver time, or the solver's own
        stopping rule. Returns the reports; ``callback(report)`` after each. ``checkpoint``: a file to resume from
        when it exists and to write every ``checkpoint_every`` steps and at the end. See `_fit`."""
        return self._fit({"max_iter": max_iter, "gap_tol": gap_tol, "time_budget": time_budget},
                         callback=callback, exact=exact, checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    def _fit(self, limits: dict, *, callback=None, exact: bool = True,
             checkpoint: Union[str, os.PathLike, None] = None, checkpoint_every: int = 1) -> list:
        """The one loop behind every `fit`. ``limits`` maps the public keywords of the solver's `fit`, in order, to
        their values: ``limit_name`` (the progress limit), ``"gap_tol"``, ``"time_budget"`` and any tolerance the
        solver's `_done` reads.

        Each is None or a number ``>= 0`` (`check_limits`); with ``requires_limit``, at least one is given. A
        progress limit already met runs no step (and warns, `ConvergenceWarning`, when a tolerance was given: it
        was not checked). After each step: when an estimated gap is at most
        ``0.8 gap_tol`` (and ``exact``), the exact pass `_certify` replaces it; the callback; then the stops, in
        this order: `_done` (``converged``, the tolerances), the progress limit, the time budget; a report whose
        primal, dual or gap is NaN raises a FloatingPointError instead of stopping or going on. A run that a
        limit or the time budget stopped while a tolerance was given warns (`ConvergenceWarning`). While it runs,
        ``_hold_below`` is ``gap_tol``.

        ``checkpoint`` (a path): when the file exists, the run first resumes from it (`load_checkpoint`, then
        `load_state_dict`: a file of another run, data or configuration is refused, naming why); the state is then
        written to it atomically after every ``checkpoint_every`` steps and when the loop ends. Limits count from the
        start of training, so the same ``fit`` call, run again after the process was killed, resumes and ends where
        the uninterrupted run ends (bitwise on the CPU), having lost at most ``checkpoint_every`` steps."""
        names = tuple(limits)
        if self.requires_limit and all(v is None for v in limits.values()):
            raise ValueError(f"fit needs at least one of {', '.join(names)}")
        check_limits(integer=(self.limit_name,) if self.limit_integer else (), **limits)
        limit, gap_tol, budget = limits.get(self.limit_name), limits.get("gap_tol"), limits.get("time_budget")
        tolerances = [k for k, v in limits.items() if v is not None and k not in (self.limit_name, "time_budget")]
        if limit is not None and self.limit_relative:
            limit = self._progress() + limit  # from this call (before a resume: the run's own count)
        if checkpoint is not None:
            self._resume_checkpoint(checkpoint, checkpoint_every)
        history = History()
        if limit is not None and self._progress() >= limit:  # the limit counts from the start of training: met
            if tolerances:
                which = " and ".join(f"{k} = {limits[k]!r}" for k in tolerances)
                warnings.warn(f"{type(self).__name__}.fit took no step: {self.limit_name} = {limits[self.limit_name]!r}"
                              f" is already reached (it counts from the start of training, resumed or not: "
                              f"{self._progress():g} so far), so whether {which} holds was not checked; fit again "
                              "with a larger limit to go on", ConvergenceWarning, stacklevel=3)
            return history
        self._hold_below = gap_tol
        done = False
        try:
            while True:
                if checkpoint is not None and history and len(history) % checkpoint_every == 0:
                    self._save_checkpoint(checkpoint)  # before the next step: the last one's report
                r = self.step()
                if gap_tol is not None and exact and not r.get("gap_exact") and r.get("gap") is not None \
                        and r["gap"] <= 0.8 * gap_tol:
                    certificate = self._certify()  # a cheap estimate says done: confirm with an exact pass
                    if certificate is not None:
                        r = {**r, **certificate}
                        self._log(r)  # the certificate (and its work) at the step the estimate was logged
                history.append(r)
                bad = [k for k in ("primal", "dual", "gap") if isinstance(r.get(k), float) and math.isnan(r[k])]
                if bad:  # never a stop (converged, gap_tol) on NaN: the state is no longer a certificate of anything
                    raise FloatingPointError(f"{type(self).__name__}.step reported {', '.join(bad)} = nan at step "
                                             f"{len(history)} of this fit: the data, the state or the arithmetic "
                                             "broke down (a state saved before this step is still valid)")
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
        if checkpoint is not None and history:
            self._save_checkpoint(checkpoint)
        if tolerances and not done:
            which = " and ".join(f"{k} = {limits[k]!r}" for k in tolerances)
            by = self.limit_name if limit is not None and self._progress() >= limit else "time_budget"
            last = history[-1] if history else {}
            kind = {True: "exact", False: "an estimate"}.get(last.get("gap_exact"), None)
            gap = f"last gap {last.get('gap')!r}" + (f" ({kind})" if kind else "") if last else "no step taken"
            warnings.warn(f"{type(self).__name__}.fit stopped by {by} before reaching {which} ({gap}); fit again "
                          f"with a larger limit to go on", ConvergenceWarning, stacklevel=3)
        return history

    # -- logging ----------------------------------------------------------------------------------
    @property
    def writer(self):
        """The TensorBoard ``SummaryWriter`` the reports are logged to, or None; checked when set, so that a wrong
        object fails at construction rather than at the end of the first pass."""
        return self._writer

    @writer.setter
    def writer(self, value) -> None:
        if value is not None and not callable(getattr(value, "add_scalar", None)):
            raise TypeError(f"writer must be a TensorBoard SummaryWriter (an object with add_scalar) or None, got "
                            f"{type(value).__name__} {value!r}")
        self._writer = value

    # -- progress inside a step ----------------------------------------------------------------------
    _progress_hook = None

    @property
    def progress(self):
        """A callable ``progress(phase, done, total)`` called while a step runs, or None (default).

        ``phase`` is ``"pass"`` while a pass visits blocks (``done`` of ``total`` blocks visited; BCFW calls it
        after every update, batch Frank-Wolfe and SSG after every oracle call, the n-slack cutting plane per chunk
        of its separation), ``"gap"`` while an exact gap pass runs (``done`` of ``total`` blocks decoded, per
        chunk) and ``"qp"`` after each sweep of the n-slack working-set QP (``done`` sweeps of at most
        ``total``). For a progress bar or a periodic line when a pass takes minutes; the call costs one Python call
        per update and reads nothing from a device. It must not change the solver."""
        return self._progress_hook

    @progress.setter
    def progress(self, value) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"progress must be a callable progress(phase, done, total) or None, got "
                            f"{type(value).__name__} {value!r}")
        self._progress_hook = value

    def _tick(self, phase: str, done: int, total: int) -> None:
        """Report progress inside a step to `progress` (no-op without one)."""
        if self._progress_hook is not None:
            self._progress_hook(phase, done, total)

    # what a report holds under these names when it says ``gap_exact = False``: estimates, logged under
    # ``{key}_estimate`` so that a certified tag (``{tag}/gap``, ``{tag}/primal``) only ever holds certified values
    # (solvers whose reports name their estimates themselves, GDMM's ``gap_estimate``, declare none)
    estimated_keys: tuple = ()

    def _log(self, report: dict) -> None:
        """The finite ``report_keys`` entries of ``report`` as scalars ``{tag}/{key}`` at `_log_step`, then
        `_log_extra`; nothing without a ``writer``. In a report with ``gap_exact = False`` the ``estimated_keys``
        are estimates: they go to ``{tag}/{key}_estimate`` instead (an estimate never under a certified name)."""
        if self.writer is None:
            return
        step = self._log_step(report)
        keys = self.report_keys
        estimated = self._estimated(report)
        if estimated:
            report = {**report, **{f"{k}_estimate": report.get(k) for k in estimated}}
            keys = tuple(f"{k}_estimate" if k in estimated else k for k in keys)
        log_scalars(self.writer, self.tag, report, keys, step)
        self._log_extra(report, step)

    def _estimated(self, report: dict) -> tuple:
        """The entries of ``report`` that are estimates, not certified values: by default the `estimated_keys` of
        a report that says ``gap_exact = False``. Solvers whose certified names hold estimates under other
        conditions (a dual value that bounds nothing at an infeasible iterate) override it."""
        return self.estimated_keys if report.get("gap_exact") is False else ()

    def _log_step(self, report: dict) -> int:
        return self.steps_done

    def _log_extra(self, report: dict, step: int) -> None:
        """What a solver logs beyond the scalars of ``report_keys``."""

    # -- state ----------------------------------------------------------------------------------------
    def _config(self) -> dict:
        """The settings of the objective that a state is bound to (`_state.check_config`)."""
        return {}

    def _data(self) -> dict:
        """The training data a state is bound to, ``{name: tensor}`` (fingerprinted in `state_dict`; `{}`: none)."""
        return {}

    def _fingerprint(self) -> Optional[str]:
        """The `fingerprint` of `_data` (None without data), kept while the data's tensors are unchanged."""
        data = self._data()
        if not data:
            return None
        flat = [t for v in data.values() for t in (v if isinstance(v, (tuple, list)) else (v,))
                if isinstance(t, torch.Tensor)]
        key = tuple((id(t), t._version) for t in flat)
        memo = getattr(self, "_fingerprint_memo", None)
        if memo is None or memo[0] != key:
            memo = self._fingerprint_memo = (key, fingerprint(data))
        return memo[1]

    def _sealed(self) -> tuple:
        """The state tensors that `_check_consistency` cannot recompute from the rest of the state: `state_dict`
        records their SHA-256 digests under ``"seal"`` and `load_state_dict` refuses a state whose tensors no longer
        match them (an edit is detected; a forgery that also rewrites the seal is not). Default: none."""
        return ()

    def _extra_state(self) -> dict:
        """Entries a solver adds to `state_dict` beyond the declared ones. Called first: a solver may settle
        counters there that the declared scalars then read."""
        return {}

    def state_dict(self) -> dict:
        """The declared state tensors (copies) and scalars, the configuration `_config`, the data's
        ``"fingerprint"`` (solvers with `_data`), the ``"seal"`` of `_sealed`, ``"state_version"``
        (`STATE_VERSION`) and `_extra_state`."""
        extra = self._extra_state()
        s = {k: getattr(self, k).clone() for k in self._state_tensors}
        s.update({k: getattr(self, k) for k in self._state_scalars})
        s.update(self._config())
        data = self._fingerprint()
        if data is not None:
            s["fingerprint"] = data
        sealed = self._sealed()
        if sealed:
            s["seal"] = {k: fingerprint({k: s[k]}) for k in sealed}
        s["state_version"] = STATE_VERSION
        s.update(extra)
        return s

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict`: the run continues the same trajectory. A state is checked, not trusted: one of
        other sizes or dtypes, saved under another configuration (`_config`) or on other data (its fingerprint),
        with a negative counter, or whose tensors disagree with each other beyond rounding (`_check_consistency`)
        raises a ValueError naming what is wrong and leaves the solver unchanged: everything is checked
        (`_checked_state`, `_check_consistency`) before anything is set (`_set_state`)."""
        try:
            checked = self._checked_state(state)
            self._check_consistency(checked)
        except ValueError as e:
            older = explain_older_state(state, e)
            if older is e:
                raise
            raise older from e
        self._set_state(checked)

    def _state_shape(self, key: str, state: dict) -> tuple:
        """The shape state tensor ``key`` must have (default: the current one's)."""
        return tuple(getattr(self, key).shape)

    def _scalar_types(self) -> dict:
        """``{name: int / float / bool}`` of the declared scalars (default: their current types)."""
        return {k: type(getattr(self, k)) for k in self._state_scalars}

    def _checked_state(self, state: dict) -> dict:
        """The attributes to set from ``state``, all checked (subclasses add theirs); nothing is set here. Counts
        (the int scalars) and ``seconds`` must be ``>= 0``."""
        version = state.get("state_version", 1) if isinstance(state, dict) else 1
        if isinstance(version, bool) or not isinstance(version, int) or version > STATE_VERSION:
            raise ValueError(f"state_dict['state_version'] = {version!r}: saved by a newer torchssvm than this one "
                             f"(which reads versions up to {STATE_VERSION})")
        require_keys(state, (*self._state_tensors, *self._state_scalars))
        check_config(state, self._config())
        out = {k: checked_tensor(state, k, self._state_shape(k, state), getattr(self, k))
               for k in self._state_tensors}
        types = self._scalar_types()
        out.update(checked_scalars(state, types))
        for k, kind in types.items():
            if (kind is int or k == "seconds") and out[k] < 0:
                raise ValueError(f"state_dict[{k!r}] must be >= 0, got {out[k]!r}")
        mine = self._fingerprint()
        if mine is not None:
            if "fingerprint" not in state:
                raise ValueError("state_dict has no 'fingerprint' of its training data: it was saved by a torchssvm "
                                 "that did not record one, and cannot be checked against this solver's data")
            if state["fingerprint"] != mine:
                raise ValueError(f"state_dict was saved on other training data or another model structure "
                                 f"(fingerprint {str(state['fingerprint'])[:12]}..., this solver's {mine[:12]}...), or "
                                 "by a torchssvm that fingerprinted less: its blocks would certify another objective")
        for k in self._sealed():
            seal = state.get("seal")
            if not isinstance(seal, dict) or k not in seal:
                raise ValueError(f"state_dict has no seal of {k!r}, which cannot be recomputed from the rest of the "
                                 "state: it was saved by a torchssvm that did not record one")
            if seal[k] != fingerprint({k: state[k]}):
                raise ValueError(f"state_dict[{k!r}] was changed after the state was saved (its SHA-256 disagrees "
                                 "with the state's seal), and cannot be recomputed from the rest of the state")
        return out

    def _check_consistency(self, checked: dict) -> None:
        """Recompute from the checked state what can be recomputed without an oracle and raise a ValueError naming
        the entry that disagrees beyond rounding (default: nothing to recompute)."""

    def _set_state(self, checked: dict) -> None:
        for k, value in checked.items():
            setattr(self, k, value)
