"""GDMM: dual-decomposed SSVM learning with factorwise oracles (Yen et al., NIPS 2016), for chains.

(``GDMM(problem)`` with a `MultiLabelProblem` returns the pairwise multi-label solver of ``gdmm_multilabel.py``.)

The SSVM ``min_w 1/2 ||w||^2 + C sum_i H_i(w)`` (our ``lam = 1 / (C n)``) is split over factors: every token t
has a unigram dual ``alpha_t`` over the K labels, every edge e = (t, t+1) a bigram dual ``beta_e`` over the K^2
label pairs, both on the shifted simplex ``{a(truth) <= C, a(y) <= 0 otherwise, sum a = 0}`` (eq. 11) and
kept sparse as active sets. They are coupled by the local-consistency constraints ``rowsum(beta_e) =
alpha_left``, ``colsum(beta_e) = alpha_right`` under an augmented Lagrangian (eq. 12, penalty ``rho``,
scaled multipliers ``lam_L, lam_R``). With ``w = sum_t x_t alpha_t^T`` (emission and biases: start / end are
indicator features of the first / last token) and ``v = sum_e beta_e`` (the transition table), the
minimized dual is ``G = 1/2 ||w||^2 + 1/2 ||v||^2 + sum_t delta_t^T alpha_t`` (with the sign of the dual fixed).

One outer iteration (`GDMM.step`, Algorithm 1 of Yen et al. (2016)):

1. every unigram factor, in a random order: the factorwise oracle (FMO) ``argmax_k g_t(k)`` over the
   labels outside the active set, ``g_t = w^T x_t + delta_t - rho (m_R[left edge] + m_L[right edge])`` (the
   gradient of the Lagrangian); the label joins the active set when it gives a descent direction
   (``g_t(k) > g_t(j)`` for an active ``j`` below its cap), then the exact block minimization on the active
   set (the block Hessian is ``(||x_t||^2 + rho deg_t) I``): a shifted-simplex projection.
   ``fmo="sampled"`` searches one of ``nu`` random label blocks (eq. 21).
2. every bigram factor, in a random order: the FMO over the K^2 pairs (`factor_oracles.bigram_fmo`,
   exact, sublinear with a `BigramIndex`), then the update of the whole active set ("fully corrective" in
   the reference code's sense, as opposed to a Frank-Wolfe step towards one vertex). ``bigram_update="step"``
   (the default, the reference code's): one projected step with ``Q = 1 + rho (max row count + max column
   count)``, an upper bound on the block Hessian ``I + rho (R^T R + K^T K)`` (pairs sharing a row or a
   column are coupled through the messages). ``bigram_update="exact"``: the exact minimizer of the
   Lagrangian over the factor's active set, the small QP of `shifted_simplex_qp` (an active-set method,
   exact to rounding). The exact update was no faster in our runs (parity on POS, behind on the K = 3,000
   chain, mixed on multi-label Yeast; docs/benchmarks/gdmm_findings.md), so the step is the default.
3. the multiplier step ``lam_L += eta (rowsum beta - alpha_left)``, likewise ``lam_R`` (eq. 13); ``eta = 0`` is
   Soft-BCFW (Meshi et al. 2015, the quadratic-penalty approximation).

``batch_size=1`` is the faithful sequential (Gauss-Seidel) algorithm; on CPU with the exact FMO and the
brute-force bigram search (K <= 128) its passes run as compiled loops when numba is installed
(``engine="auto"``/``"numba"``, `gdmm_numba`: the same updates in the same order, up to rounding, some 50x
faster than one factor per tensor-op batch). ``batch_size=B`` updates B factors of
a pass at once (block-Jacobi): every proposal is computed at the same iterate and the B step sizes are
chosen jointly by the exact B x B box QP of the Lagrangian along them (`box_qp`, the coordinated step of
docs/design.md): factors of one pass share no message, only ``w`` (unigram) or ``v`` (bigram), so that QP is
exact, the Lagrangian never increases and ``B = 1`` is the sequential step (its line search returns 1).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Optional

import numpy as np
import torch

from ..._validation import check_positive_float, check_real, check_seed
from ...kernels import project_shifted_simplex
from .._state import check_close, check_range, checked_generator_state, checked_scalars, require_keys
from ..frank_wolfe.box_qp import box_qp
from ..problems import ChainProblem, make_problem
from ..solver import Solver
from .factor_oracles import BigramIndex, bigram_fmo
from .shifted_simplex_qp import block_hessian_chain, shifted_simplex_qp

FMOS = ("exact", "sampled")
EXTRA_ROWS = ("bias", "start", "end")  # model parameters that are indicator features of a token
BIGRAM_SEARCHES = ("auto", "index", "brute")
ENGINES = ("auto", "torch", "numba")
BIGRAM_UPDATES = ("exact", "step")
_MAX_DROP_TOL = 1e-9
_BRUTE_MAX_K = 128  # "auto": below this K the K^2 scan is cheaper than keeping the index


def chain_w_from_tables(problem: ChainProblem, W: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The flat ``w`` of ``problem``'s model from the token-factor table ``W (D + extras, K)`` (emission rows,
    then one row per bias / start / end parameter the model has, in that order) and the transition ``v (K, K)``."""
    w = torch.zeros(problem.d, dtype=torch.float64, device=W.device)
    slices = problem.parameter_slices()
    rows = {"emission": W[: problem.D].reshape(-1), "transition": v.reshape(-1)}
    rows.update((name, W[problem.D + r]) for r, name in enumerate(k for k in EXTRA_ROWS if k in slices))
    for name, (a, b, _) in slices.items():
        w[a:b] = rows[name]
    return w


class GDMM(Solver):
    """``solver = GDMM(model, dataset, lam=1e-2, rho=0.1, eta=1.0, fmo="exact")``; ``solver.step()`` runs one
    outer iteration and returns a report; `fit` loops; `state_dict` / `load_state_dict` resume.

    Args:
        model: a `LinearChainModel` (dense or sparse features) whose parameters receive ``w``; or a
            `MultiLabelProblem` (then ``dataset`` is None and the solver is a `MultiLabelGDMM`).
        dataset: its training `SequenceDataset`.
        lam: the regularization ``lam > 0`` of ``lam/2 ||w||^2 + (1/n) sum_i H_i`` (every solver's), over the n
            training examples (sequences). The algorithm runs on the paper's ``1/2 ||w||^2 + C sum_i H_i``, the
            same objective times ``1 / lam``, with ``C = 1 / (lam n)``: the same iterates ``w``. Default (neither
            ``lam`` nor ``C``): ``C = 1``, i.e. ``lam = 1 / n``.
        C: deprecated keyword (a DeprecationWarning): the paper's ``C``; `GDMM.from_C` is the C form.
        rho: the augmented-Lagrangian penalty (Yen et al., 2016, use 0.1 on POS, 1-10 on ChineseOCR).
        eta: the multiplier step (1 in every run of the paper); 0 gives Soft-BCFW.
        fmo: ``"exact"`` or ``"sampled"`` unigram oracle; ``nu``: its number of label blocks.
        batch_size: factors updated at once (1: sequential; larger: block-Jacobi with the joint step).
        bigram_search: ``"index"`` (sublinear exact search), ``"brute"`` (K^2 per edge) or ``"auto"``.
        bigram_update: ``"step"`` (one projected step with an upper bound of the block Hessian, as the paper's
            code) or ``"exact"`` (the block minimizer on the active set, `shifted_simplex_qp`).
        engine: ``"numba"`` (compiled sequential passes, `gdmm_numba`), ``"torch"`` or ``"auto"``.
        structure: a `Chain` for the task loss (default ``Chain(K)``: Hamming normalized by length;
            ``Chain(K, normalize=False)`` is the paper's per-token loss).
        primal_every: compute the exact primal (one oracle pass: Viterbi for chains, enumeration for
            multi-label; not timed) every this many iterations (0: never).
        drop_tol: active entries with ``|alpha| <= drop_tol`` leave the active set (never the truth); at most 1e-9,
            a rounding threshold (the dropped value is not taken out of the primal tables).
        seed, writer, backend: random generator seed, TensorBoard ``SummaryWriter``, Viterbi backend.

    Reports: ``iteration``, ``dual = -lam G`` (a lower bound on the optimum only when the iterate is
    consistent), ``lagrangian`` (``lam L``), ``infeasibility`` (mean L1 residual ``|rowsum beta - alpha|`` per
    edge side), ``primal`` (exact, at ``w(alpha)``, when computed), ``gap_estimate = primal - dual`` (whenever the
    primal is computed) and ``gap``: the same number, but only where it is a certificate, i.e. the iterate is
    feasible (``infeasibility <= feasibility_tol C``) and the local relaxation is tight (chains; multi-label
    structures without cycles), else None (``gap_exact`` says which). Before feasibility ``dual`` is the value of
    an infeasible iterate, which may exceed the optimum: ``gap_estimate`` may then be negative, and is no bound.
    A report's ``converged`` is never set (the stops are ``infeasibility_tol`` and the limits).
    ``active_unigram`` / ``active_bigram`` (mean active-set sizes), ``visits_unigram`` / ``visits_bigram``
    (mean entries read per FMO call), ``inner_bigram`` (mean face changes per factor of the exact bigram
    update; 0 with the step), ``time`` (solver seconds, evaluation excluded).
    """

    tag = "gdmm"

    # {problem type: the subclass that `GDMM(problem)` builds for it}, filled by the subclasses themselves
    # (``class MultiLabelGDMM(GDMM, problem_type=MultiLabelProblem)``): the variants import this module, never the
    # reverse, and `torchssvm.optim` imports them all, so each is registered before any `GDMM` is built.
    _variants: dict = {}

    def __init_subclass__(cls, problem_type=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if problem_type is not None:
            GDMM._variants[problem_type] = cls

    def __new__(cls, model=None, *args, **kwargs):
        if cls is GDMM:
            for problem_type, variant in GDMM._variants.items():
                if isinstance(model, problem_type):
                    return super().__new__(variant)
        return super().__new__(cls)

    @classmethod
    def from_C(cls, model, dataset=None, C: float = 1.0, **kwargs):
        """The solver of the paper's ``1/2 ||w||^2 + C sum_i H_i`` (``lam = 1 / (C n)``, n training examples):
        ``GDMM.from_C(model, dataset, C=1.0, rho=...)``; the other arguments are those of `GDMM`."""
        solver = cls.__new__(cls, model)  # GDMM(problem) may build a variant: its __init__ runs
        solver._C_form = True
        solver.__init__(model, dataset, C=C, **kwargs)
        return solver

    def _check_args(self, lam, C, rho, eta, fmo, nu, batch_size, primal_every, drop_tol, bigram_update) -> None:
        """Validate and store ``lam`` or ``C`` (`_set_regularization` converts once n is known), ``rho, eta``;
        check the rest (shared by the chain and multi-label solvers)."""
        if lam is not None and C is not None:
            raise ValueError("pass lam or C, not both (lam = 1 / (C n))")
        if C is not None and not getattr(self, "_C_form", False):
            warnings.warn("GDMM(C=...) is deprecated: pass lam = 1 / (C n) (n training examples), or use "
                          "GDMM.from_C(model, dataset, C, ...)", DeprecationWarning, stacklevel=3)
        self._lam_arg = None if lam is None else check_positive_float("lam", lam)
        self.C = check_positive_float("C", 1.0 if C is None else C)
        self.rho = check_positive_float("rho", rho)
        try:
            self.eta = float(eta)
        except (TypeError, ValueError):
            raise TypeError(f"eta must be a number, got {eta!r}") from None
        if not (self.eta >= 0 and math.isfinite(self.eta)):
            raise ValueError(f"eta must be a finite number >= 0, got {eta}")
        if fmo not in FMOS:
            raise ValueError(f"fmo must be one of {FMOS}, got {fmo!r}")
        if bigram_update not in BIGRAM_UPDATES:
            raise ValueError(f"bigram_update must be one of {BIGRAM_UPDATES}, got {bigram_update!r}")
        for name, value, low in (("nu", nu, 1), ("batch_size", batch_size, 1), ("primal_every", primal_every, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if fmo == "exact" and nu != 1:
            raise ValueError(f"nu={nu} needs fmo='sampled' (the exact oracle searches every label)")
        drop_tol = check_real("drop_tol", drop_tol)
        if not (0 <= drop_tol <= _MAX_DROP_TOL):
            # a dropped entry's value leaves alpha but not the primal tables (W, v): beyond rounding they disagree
            raise ValueError(f"drop_tol must be in [0, {_MAX_DROP_TOL}] (a rounding threshold), got {drop_tol}")

    def __init__(self, model, dataset=None, lam: Optional[float] = None, *, C: Optional[float] = None,
                 rho: float = 0.1, eta: float = 1.0,
                 fmo: str = "exact", nu: int = 1, batch_size: int = 1, bigram_search: str = "auto",
                 structure=None, primal_every: int = 1, drop_tol: float = 1e-12, seed: int = 0, writer=None,
                 backend: str = "auto", engine: str = "auto", bigram_update: str = "step"):
        self._check_args(lam, C, rho, eta, fmo, nu, batch_size, primal_every, drop_tol, bigram_update)
        if bigram_search not in BIGRAM_SEARCHES:
            raise ValueError(f"bigram_search must be one of {BIGRAM_SEARCHES}, got {bigram_search!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        problem = make_problem(model, dataset, structure, backend=backend)
        if not isinstance(problem, ChainProblem):
            raise TypeError(f"GDMM supports chains (LinearChainModel) and multi-label problems (MultiLabelProblem); "
                            f"got {type(problem).__name__}")
        if problem.structure.class_weights is not None:
            raise ValueError("GDMM needs a Hamming loss without class weights (the loss sits on unigram duals "
                             "as one cost per wrong token)")
        self.problem, self.fmo, self.nu, self.batch_size = problem, fmo, nu, batch_size
        self.bigram_update = bigram_update
        self.primal_every, self.drop_tol, self.writer = primal_every, float(drop_tol), writer
        p = self.problem
        self.K, self.n, self.device = p.K, p.n, p.device
        if nu > self.K:  # the label blocks are a split of the K labels: an empty block has no argmax
            raise ValueError(f"nu must be <= K = {self.K} (nu label blocks split the labels), got {nu}")
        self._set_regularization()
        K, dev, f64 = self.K, self.device, torch.float64
        self.bigram_search = ("brute" if K <= _BRUTE_MAX_K else "index") if bigram_search == "auto" else bigram_search
        self.engine = self._resolve_engine(engine)

        # -- factors: tokens (unigram) and edges (bigram) --------------------------------------
        valid = p.truth >= 0
        seq, pos = valid.nonzero(as_tuple=True)
        self.N = N = seq.numel()
        self.y = p.truth[valid]
        self.delta = p.structure.position_loss_weights(p.truth, p.lengths)[valid].to(f64)
        last = pos == p.lengths[seq] - 1
        left = (~last).nonzero(as_tuple=True)[0]  # edge e joins tokens left[e] and left[e] + 1
        self.E = E = left.numel()
        self.edge_left, self.edge_right = left, left + 1
        self.tok_left_edge = torch.full((N,), -1, dtype=torch.long, device=dev)
        self.tok_right_edge = torch.full((N,), -1, dtype=torch.long, device=dev)
        self.tok_left_edge[left + 1] = torch.arange(E, device=dev)
        self.tok_right_edge[left] = torch.arange(E, device=dev)
        self.deg = ((self.tok_left_edge >= 0).to(f64) + (self.tok_right_edge >= 0).to(f64))
        self.ybig = self.y[left] * K + self.y[left + 1]
        self._features(p, valid, seq, pos, last)

        # -- state ------------------------------------------------------------------------------
        self.uidx = self.y.unsqueeze(1).clone()  # active labels (-1: free slot); the truth is always active
        self.uval = torch.zeros(N, 1, dtype=f64, device=dev)
        self.bidx = self.ybig.unsqueeze(1).clone()  # active pairs k1 K + k2
        self.bval = torch.zeros(E, 1, dtype=f64, device=dev)
        self.W = torch.zeros(self.Dx, K, dtype=f64, device=dev)
        self.v = torch.zeros(K, K, dtype=f64, device=dev)
        self.lam_L = torch.zeros(E, K, dtype=f64, device=dev)
        self.lam_R = torch.zeros(E, K, dtype=f64, device=dev)
        self.generator = torch.Generator(device="cpu").manual_seed(check_seed(seed))
        self.label_blocks = torch.randperm(K, generator=self.generator).to(dev).tensor_split(nu)
        self.index = BigramIndex(self.v) if self.bigram_search == "index" else None
        self.iterations, self.seconds = 0, 0.0
        self.eta_total = 0.0  # sum of eta over the iterations: the multipliers' bound (`_check_multipliers`)
        self.fmo_calls = {"unigram": 0, "bigram": 0}
        self.fmo_visits = {"unigram": 0, "bigram": 0}
        self.inner = {"bigram": 0}  # face changes of the exact bigram update
        self.last_primal: Optional[float] = None
        self._x_numba = None
        self._write_model()

    def _set_regularization(self) -> None:
        """``lam`` and ``C = 1 / (lam n)`` from the one given (``C``: ``lam = 1 / (C n)``)."""
        if self._lam_arg is None:
            self.lam = 1.0 / (self.C * self.n)
        else:
            self.lam, self.C = self._lam_arg, 1.0 / (self._lam_arg * self.n)

    def _features(self, p, valid, seq, pos, last) -> None:
        """Token features ``x_t`` with the model's bias / first / last indicators appended (rows of ``W``
        in the order emission, bias, start, end: `_write_model`)."""
        f64, dev = torch.float64, self.device
        extras = []
        slices = p.parameter_slices()
        if "bias" in slices:
            extras.append(torch.ones(self.N, dtype=f64, device=dev))
        if "start" in slices:
            extras.append((pos == 0).to(f64))
        if "end" in slices:
            extras.append(last.to(f64))
        D = p.D
        self.Dx = D + len(extras)
        if p.sparse:
            ids = p.x.ids[valid]
            vals = (ids >= 0).to(f64) if p.x.values is None else p.x.values[valid].to(f64) * (ids >= 0)
            ex_ids = torch.arange(D, self.Dx, device=dev).expand(self.N, len(extras))
            ex_vals = torch.stack(extras, 1) if extras else vals.new_zeros(self.N, 0)
            ex_ids = torch.where(ex_vals != 0, ex_ids, torch.full_like(ex_ids, -1))
            self.x_ids = torch.cat([ids, ex_ids], 1)
            self.x_vals = torch.cat([vals, ex_vals], 1)
            self.x_sqnorm = self._sparse_gram_diag(self.x_ids, self.x_vals)
            self.x = None
        else:
            self.x = torch.cat([p.x[valid].to(f64)] + [e.unsqueeze(1) for e in extras], 1)
            self.x_sqnorm = (self.x * self.x).sum(1)
            self.x_ids = self.x_vals = None

    @staticmethod
    def _sparse_gram_diag(ids, vals) -> torch.Tensor:
        same = (ids.unsqueeze(2) == ids.unsqueeze(1)) & (ids.unsqueeze(2) >= 0)
        return (same * vals.unsqueeze(2) * vals.unsqueeze(1)).sum((1, 2))

    # -- w(alpha) -------------------------------------------------------------------------------
    def flat_w(self) -> torch.Tensor:
        """``w`` in the model's flat parameter order (`ChainProblem.parameter_slices`)."""
        return chain_w_from_tables(self.problem, self.W, self.v)

    def _write_model(self) -> None:
        self.problem.write_model(self.flat_w())

    # -- token features -------------------------------------------------------------------------
    def _scores(self, tok: torch.Tensor, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``<w_k, x_t>``: ``(B, K)`` for every label, or ``(B, M)`` for ``labels (B, M)`` (valid ids)."""
        if self.x is not None:
            x = self.x[tok]
            if labels is None:
                return x @ self.W
            return torch.bmm(self.W.t()[labels], x.unsqueeze(2)).squeeze(2)
        ids, vals = self.x_ids[tok], self.x_vals[tok]
        rows = self.W[ids.clamp_min(0)] * vals.unsqueeze(2)  # (B, A, K)
        if labels is None:
            return rows.sum(1)
        return rows.gather(2, labels.unsqueeze(1).expand(-1, ids.shape[1], -1)).sum(1)

    def _x_gram(self, tok: torch.Tensor) -> torch.Tensor:
        if self.x is not None:
            x = self.x[tok]
            return x @ x.t()
        ids, vals = self.x_ids[tok], self.x_vals[tok]
        ok = ids >= 0
        rows = torch.arange(ids.shape[0], device=self.device).unsqueeze(1).expand_as(ids)[ok]
        X = torch.sparse_coo_tensor(torch.stack([rows, ids[ok]]), vals[ok], (ids.shape[0], self.Dx),
                                    check_invariants=False).coalesce()
        with warnings.catch_warnings():  # "sparse CSR support is in beta", raised inside sparse.mm
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse.mm(X, X.t()).to_dense()

    def _add_to_W(self, tok: torch.Tensor, dense_delta: torch.Tensor) -> None:
        """``W += sum_b x_{tok_b} dense_delta_b^T`` for ``dense_delta (B, K)``."""
        if self.x is not None:
            self.W.add_(self.x[tok].t() @ dense_delta)
            return
        ids, vals = self.x_ids[tok], self.x_vals[tok]
        self.W.index_add_(0, ids.clamp_min(0).reshape(-1), (vals.unsqueeze(2) * dense_delta.unsqueeze(1)).reshape(
            -1, self.K))

    # -- dense views of the sparse duals --------------------------------------------------------
    def _dense(self, idx: torch.Tensor, val: torch.Tensor, width: int, key=None) -> torch.Tensor:
        ok = idx >= 0
        cols = idx.clamp_min(0) if key is None else key(idx.clamp_min(0))
        return torch.zeros(idx.shape[0], width, dtype=torch.float64, device=self.device).scatter_add_(
            1, cols, val * ok)

    def _alpha_dense(self, tok: torch.Tensor) -> torch.Tensor:
        return self._dense(self.uidx[tok], self.uval[tok], self.K)

    def _rowsum(self, e: torch.Tensor) -> torch.Tensor:
        return self._dense(self.bidx[e], self.bval[e], self.K, key=lambda i: i // self.K)

    def _colsum(self, e: torch.Tensor) -> torch.Tensor:
        return self._dense(self.bidx[e], self.bval[e], self.K, key=lambda i: i % self.K)

    def _edge_messages(self, e: torch.Tensor):
        """``m_L = rowsum(beta_e) - alpha_left + lam_L``, ``m_R = colsum(beta_e) - alpha_right + lam_R`` (B, K)."""
        mL = self._rowsum(e) - self._alpha_dense(self.edge_left[e]) + self.lam_L[e]
        mR = self._colsum(e) - self._alpha_dense(self.edge_right[e]) + self.lam_R[e]
        return mL, mR

    def _token_messages(self, tok: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``m_R[left edge] + m_L[right edge]`` (B, K): the messages that hold ``alpha_t``."""
        out = torch.zeros_like(alpha)
        el, er = self.tok_left_edge[tok], self.tok_right_edge[tok]
        has = el >= 0
        if has.any():
            e = el[has]
            out[has] += self._colsum(e) + self.lam_R[e] - alpha[has]
        has = er >= 0
        if has.any():
            e = er[has]
            out[has] += self._rowsum(e) + self.lam_L[e] - alpha[has]
        return out

    # -- active sets ----------------------------------------------------------------------------
    @staticmethod
    def _pad(idx, val, pad: int, *more):
        """``pad`` free slots (index -1, value 0) appended to padded active sets ``idx, val`` and zero columns
        to each of ``more``; returns them in the same order."""
        return (torch.cat([idx, idx.new_full((idx.shape[0], pad), -1)], 1),
                *(torch.cat([t, t.new_zeros(t.shape[0], pad)], 1) for t in (val, *more)))

    @staticmethod
    def _append(idx, val, g, new, new_g, add):
        """Put ``new[b]`` (gradient ``new_g[b]``) into the first free slot of rows with ``add``; widens the
        local ``(B, c)`` tensors when a row is full. Returns the updated ``idx, val, g``."""
        if not bool(add.any()):
            return idx, val, g
        free = idx < 0
        if bool((add & ~free.any(1)).any()):
            idx, val, g = GDMM._pad(idx, val, max(1, idx.shape[1]), g)  # double the width
            free = idx < 0
        slot = free.to(torch.int8).argmax(1)
        rows = add.nonzero(as_tuple=True)[0]
        idx[rows, slot[rows]] = new[rows]
        g[rows, slot[rows]] = new_g[rows]
        return idx, val, g

    def _store(self, which: str, rows: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> None:
        """Write the local active sets back, widening the global tensors if needed, then drop tiny entries
        (the truth, in slot 0 from the start, stays)."""
        I, V = getattr(self, which + "idx"), getattr(self, which + "val")
        if idx.shape[1] > I.shape[1]:
            I, V = self._pad(I, V, idx.shape[1] - I.shape[1])
        elif idx.shape[1] < I.shape[1]:
            idx, val = self._pad(idx, val, I.shape[1] - idx.shape[1])
        drop = (idx >= 0) & (val.abs() <= self.drop_tol)
        drop[:, 0] = False
        idx = idx.masked_fill(drop, -1)
        val = val.masked_fill(drop, 0.0)
        I[rows], V[rows] = idx, val
        setattr(self, which + "idx", I)
        setattr(self, which + "val", V)

    def _prox(self, idx, val, g, top, Q):
        """The step ``d`` to the projection of ``val - g / Q`` onto the shifted simplex on the active set."""
        mask = idx >= 0
        u = torch.where(mask, val - g / Q.unsqueeze(1), torch.zeros_like(val))
        radius = torch.full((idx.shape[0],), self.C, dtype=torch.float64, device=self.device)
        new = project_shifted_simplex(u, top, mask, radius, backend="torch")
        return (new - val) * mask

    @staticmethod
    def _add_test(g, val, idx, cap, g_new):
        """A new coordinate helps when its gradient exceeds that of an active one with room to grow."""
        room = (idx >= 0) & (val < cap - 1e-15)
        g_min = torch.where(room, g, torch.full_like(g, math.inf)).amin(1)
        return torch.isfinite(g_new) & (g_new > g_min + 1e-12 * (1 + g_min.abs()))

    # -- the two passes -------------------------------------------------------------------------
    def _update_tokens(self, tok: torch.Tensor) -> None:
        K, B = self.K, tok.shape[0]
        idx, val, y = self.uidx[tok], self.uval[tok], self.y[tok]
        alpha = self._dense(idx, val, K)
        msg = self._token_messages(tok, alpha)
        delta = self.delta[tok].unsqueeze(1)
        ar = torch.arange(K, device=self.device)
        valid = idx >= 0
        idx_c = torch.where(valid, idx, y.unsqueeze(1))
        if self.fmo == "exact":
            g_all = self._scores(tok) + delta * (ar != y.unsqueeze(1)) - self.rho * msg
            g = g_all.gather(1, idx_c)
            search = g_all.scatter(1, idx_c, -math.inf)
            g_new, k_new = search.max(1)
            visits = K
        else:
            block = self.label_blocks[int(torch.randint(self.nu, (1,), generator=self.generator))]
            s = self._scores(tok, block.expand(B, -1))
            g_blk = s + delta * (block != y.unsqueeze(1)) - self.rho * msg[:, block]
            active = torch.zeros(B, K, dtype=torch.bool, device=self.device).scatter_(1, idx_c, True)
            g_blk = g_blk.masked_fill(active[:, block], -math.inf)
            g_new, j = g_blk.max(1)
            k_new = block[j]
            g = self._scores(tok, idx_c) + delta * (idx_c != y.unsqueeze(1)) - self.rho * msg.gather(1, idx_c)
            visits = block.numel()
        self.fmo_calls["unigram"] += B
        self.fmo_visits["unigram"] += B * visits
        cap = (idx_c == y.unsqueeze(1)).to(torch.float64) * self.C  # float64: a bool times a float is float32
        add = self._add_test(g, val, idx, cap, g_new)
        idx, val, g = self._append(idx, val, g, k_new, g_new, add)
        Q = self.x_sqnorm[tok] + self.rho * self.deg[tok] + 1e-12
        top = torch.zeros(B, dtype=torch.long, device=self.device)  # the truth sits in slot 0
        d = self._prox(idx, val, g, top, Q)
        dd = self._dense(idx, d, K)
        if B > 1:
            H = self._x_gram(tok) * (dd @ dd.t())
            H.diagonal().add_(self.rho * self.deg[tok] * (d * d).sum(1))
            gamma = box_qp(-(g * d).sum(1), H, torch.ones(B, dtype=torch.float64, device=self.device))
            d, dd = d * gamma.unsqueeze(1), dd * gamma.unsqueeze(1)
        self._add_to_W(tok, dd)
        self._store("u", tok, idx, val + d)

    def _update_edges(self, e: torch.Tensor) -> None:
        K, B = self.K, e.shape[0]
        idx, val, top_pair = self.bidx[e], self.bval[e], self.ybig[e]
        mL, mR = self._edge_messages(e)
        valid = idx >= 0
        idx_c = torch.where(valid, idx, top_pair.unsqueeze(1))
        k1, k2 = idx_c // K, idx_c % K
        g = self.v[k1, k2] + self.rho * (mL.gather(1, k1) + mR.gather(1, k2))
        n1, n2, g_new, visited = bigram_fmo(self.v, mL, mR, self.rho, torch.where(valid, idx, -1),
                                            index=self.index, method=self.bigram_search)
        self.fmo_calls["bigram"] += B
        self.fmo_visits["bigram"] += int(visited.sum())
        cap = (idx_c == top_pair.unsqueeze(1)).to(torch.float64) * self.C
        add = self._add_test(g, val, idx, cap, g_new) & (n1 >= 0)
        idx, val, g = self._append(idx, val, g, n1.clamp_min(0) * K + n2.clamp_min(0), g_new, add)
        valid = idx >= 0
        k1, k2 = idx.clamp_min(0) // K, idx.clamp_min(0) % K
        top = torch.zeros(B, dtype=torch.long, device=self.device)
        if self.bigram_update == "exact":
            d, info = shifted_simplex_qp(val, g, block_hessian_chain(idx, K, self.rho), valid, top, self.C)
            self.inner["bigram"] += int(info["iterations"].sum())
        else:
            pair_ok = valid.unsqueeze(2) & valid.unsqueeze(1)
            rows = ((k1.unsqueeze(2) == k1.unsqueeze(1)) & pair_ok).sum(2).amax(1)
            cols = ((k2.unsqueeze(2) == k2.unsqueeze(1)) & pair_ok).sum(2).amax(1)
            Q = 1.0 + self.rho * (rows + cols).to(torch.float64)
            d = self._prox(idx, val, g, top, Q)
        if B > 1:
            pairs, inv = torch.unique(torch.where(valid, idx, -1), return_inverse=True)
            dd = torch.zeros(B, pairs.numel(), dtype=torch.float64, device=self.device).scatter_add_(1, inv, d)
            dd[:, pairs < 0] = 0.0
            H = dd @ dd.t()
            rs = self._dense(idx, d, K, key=lambda i: i // K)
            cs = self._dense(idx, d, K, key=lambda i: i % K)
            H.diagonal().add_(self.rho * ((rs * rs).sum(1) + (cs * cs).sum(1)))
            gamma = box_qp(-(g * d).sum(1), H, torch.ones(B, dtype=torch.float64, device=self.device))
            d = d * gamma.unsqueeze(1)
        self.v.index_put_((k1[valid], k2[valid]), d[valid], accumulate=True)
        if self.index is not None:
            self.index.refresh(rows=torch.unique(k1[valid]), cols=torch.unique(k2[valid]))
        self._store("b", e, idx, val + d)

    @torch.no_grad()
    def _multiplier_step(self, chunk: int = 4096) -> float:
        """``lam += eta (M beta - alpha)`` on every edge side; returns the mean L1 residual per side."""
        total = 0.0
        for s in range(0, self.E, chunk):
            e = torch.arange(s, min(s + chunk, self.E), device=self.device)
            rL = self._rowsum(e) - self._alpha_dense(self.edge_left[e])
            rR = self._colsum(e) - self._alpha_dense(self.edge_right[e])
            total += float(rL.abs().sum() + rR.abs().sum())
            if self.eta:
                self.lam_L[e] += self.eta * rL
                self.lam_R[e] += self.eta * rR
        return total / max(1, 2 * self.E)

    # -- objectives -----------------------------------------------------------------------------
    def dual_objective(self) -> float:
        """``G(alpha) = 1/2 ||w||^2 + 1/2 ||v||^2 + sum_t delta_t sum_{k != y_t} alpha_t(k)`` (C form)."""
        wrong = (self.uidx >= 0) & (self.uidx != self.y.unsqueeze(1))
        loss = float(((self.uval * wrong).sum(1) * self.delta).sum())
        return 0.5 * float((self.W * self.W).sum() + (self.v * self.v).sum()) + loss

    def lagrangian(self, chunk: int = 4096) -> float:
        """``L(alpha, lam) = G + rho/2 sum (||m||^2 - ||lam||^2)`` over every edge side (eq. 12)."""
        extra = 0.0
        for s in range(0, self.E, chunk):
            e = torch.arange(s, min(s + chunk, self.E), device=self.device)
            mL, mR = self._edge_messages(e)
            extra += float((mL * mL).sum() + (mR * mR).sum() - (self.lam_L[e] ** 2).sum() - (self.lam_R[e] ** 2).sum())
        return self.dual_objective() + 0.5 * self.rho * extra

    def primal_objective(self) -> float:
        """The exact SSVM primal ``lam/2 ||w||^2 + (1/n) sum_i H_i(w)`` at ``w(alpha)`` (one oracle pass)."""
        return self.problem.primal(self.flat_w(), self.lam)

    # -- loop -----------------------------------------------------------------------------------
    def _passes(self) -> None:
        """The unigram pass, then the bigram pass, in random orders, ``batch_size`` factors at a time."""
        if self.engine == "numba":
            return self._passes_numba()
        B = self.batch_size
        for chunk in torch.randperm(self.N, generator=self.generator).to(self.device).split(B):
            self._update_tokens(chunk)
        for chunk in torch.randperm(self.E, generator=self.generator).to(self.device).split(B):
            self._update_edges(chunk)

    def _resolve_engine(self, engine: str) -> str:
        """``"numba"`` (compiled sequential passes, `gdmm_numba`) or ``"torch"`` (the tensor code)."""
        from . import gdmm_numba

        fits = (self.batch_size == 1 and self.fmo == "exact" and self.bigram_search == "brute"
                and self.device.type == "cpu")
        if engine == "auto":
            return "numba" if fits and gdmm_numba.available() else "torch"
        if engine == "numba":
            if not gdmm_numba.available():
                raise RuntimeError("engine='numba' needs the numba package (pip install torchssvm[cpu])")
            if not fits:
                raise ValueError("engine='numba' runs the sequential passes on CPU: it needs batch_size=1, "
                                 "fmo='exact', bigram_search='brute' (or 'auto' with K <= 128) and CPU tensors")
        return engine

    def _passes_numba(self) -> None:
        """`_passes` by the compiled loops (same permutations from the same generator)."""
        from .gdmm_numba import edge_pass, token_pass

        if self._x_numba is None:  # token features as (ids, values) rows, dense ones included
            if self.x is not None:
                ids = torch.arange(self.Dx, device=self.device).expand(self.N, self.Dx).contiguous()
                self._x_numba = (ids.numpy(), self.x.contiguous().numpy())
            else:
                self._x_numba = (self.x_ids.contiguous().numpy(), self.x_vals.contiguous().numpy())
        ids, vals = self._x_numba
        order = torch.randperm(self.N, generator=self.generator).numpy()
        pos = 0
        while True:
            pos = token_pass(order, pos, self.uidx.numpy(), self.uval.numpy(), self.bidx.numpy(), self.bval.numpy(),
                             self.W.numpy(), self.v.numpy(), self.lam_L.numpy(), self.lam_R.numpy(), ids, vals,
                             self.x_sqnorm.numpy(), self.deg.numpy(), self.y.numpy(), self.delta.numpy(),
                             self.tok_left_edge.numpy(), self.tok_right_edge.numpy(), self.C, self.rho,
                             self.drop_tol)
            if pos == self.N:
                break
            self._widen("u")
        order = torch.randperm(self.E, generator=self.generator).numpy()
        pos = 0
        inner = np.zeros(1, dtype=np.int64)
        while True:
            pos = edge_pass(order, pos, self.uidx.numpy(), self.uval.numpy(), self.bidx.numpy(), self.bval.numpy(),
                            self.v.numpy(), self.lam_L.numpy(), self.lam_R.numpy(), self.edge_left.numpy(),
                            self.edge_right.numpy(), self.ybig.numpy(), self.C, self.rho, self.drop_tol,
                            self.bigram_update == "exact", inner)
            if pos == self.E:
                break
            self._widen("b")
        self.inner["bigram"] += int(inner[0])
        self.fmo_calls["unigram"] += self.N
        self.fmo_visits["unigram"] += self.N * self.K
        self.fmo_calls["bigram"] += self.E
        self.fmo_visits["bigram"] += self.E * self.K * self.K

    def _widen(self, which: str) -> None:
        """Double the width of the padded active sets ``which`` ("u" or "b"), as `_append` does."""
        I, V = getattr(self, which + "idx"), getattr(self, which + "val")
        I, V = self._pad(I, V, max(1, I.shape[1]))
        setattr(self, which + "idx", I)
        setattr(self, which + "val", V)

    def _active_sizes(self) -> dict:
        return {"active_unigram": float((self.uidx >= 0).sum()) / max(1, self.N),
                "active_bigram": float((self.bidx >= 0).sum()) / max(1, self.E)}

    @torch.no_grad()
    def step(self) -> dict:
        """One outer iteration: a unigram pass, a bigram pass, the multiplier step; then the report."""
        t0 = time.perf_counter()
        calls0, visits0, inner0 = dict(self.fmo_calls), dict(self.fmo_visits), self.inner["bigram"]
        self._passes()
        infeasibility = self._multiplier_step()
        self.iterations += 1
        self.eta_total += self.eta
        self.seconds += time.perf_counter() - t0
        self._write_model()
        r = {"iteration": self.iterations, "dual": -self.lam * self.dual_objective(), "infeasibility": infeasibility,
             **self._active_sizes(), "time": self.seconds}
        for kind in ("unigram", "bigram"):
            calls = self.fmo_calls[kind] - calls0[kind]
            r[f"visits_{kind}"] = (self.fmo_visits[kind] - visits0[kind]) / max(1, calls)
        r["inner_bigram"] = (self.inner["bigram"] - inner0) / max(1, self.fmo_calls["bigram"] - calls0["bigram"])
        r["lagrangian"] = self.lam * self.lagrangian()
        r["primal"] = r["gap"] = r["gap_estimate"] = None
        r["gap_exact"] = False
        if self.primal_every and self.iterations % self.primal_every == 0:
            r["primal"] = self.last_primal = self.primal_objective()
            r["gap_estimate"] = r["primal"] - r["dual"]
            if self._certifies(infeasibility) and math.isfinite(r["gap_estimate"]):
                r["gap"], r["gap_exact"] = r["gap_estimate"], True
        self._log(r)
        return r

    # the infeasibility, relative to C, at which the dual value of an iterate is taken for a lower bound (rounding)
    feasibility_tol = 1e-9

    def _tight(self) -> bool:
        """Whether the local relaxation is exact (a chain is a tree): the dual of a feasible iterate then bounds
        the SSVM's optimum from below."""
        return True

    def _certifies(self, infeasibility: float) -> bool:
        """Whether ``primal - dual`` is a certificate at an iterate of this ``infeasibility``."""
        return self._tight() and infeasibility <= self.feasibility_tol * self.C

    # -- loop (`Solver`) -------------------------------------------------------------------------
    limit_integer = True
    report_keys = ("primal", "dual", "gap", "gap_estimate", "lagrangian", "infeasibility", "active_unigram",
                   "active_bigram", "visits_unigram", "visits_bigram", "inner_bigram", "time")

    def _progress(self) -> int:
        return self.iterations

    def _estimated(self, report: dict) -> tuple:
        """The dual value bounds the optimum from below only at a feasible iterate of an exact relaxation
        (`_certifies`); elsewhere it is logged as ``gdmm/dual_estimate``, never as ``gdmm/dual``."""
        return () if self._certifies(report["infeasibility"]) else ("dual",)

    def _log_step(self, r: dict) -> int:
        return self.iterations

    def fit(self, max_iter: Optional[int] = None, time_budget: Optional[float] = None, *,
            infeasibility_tol: Optional[float] = None, callback=None, checkpoint=None,
            checkpoint_every: int = 1) -> list:
        """Call `step` until ``max_iter`` iterations (from the start of training), ``time_budget`` solver seconds,
        or (with ``infeasibility_tol``) an iterate whose infeasibility is at most that and whose gap, when computed,
        is at most ``infeasibility_tol`` too. Returns the reports; ``callback(report)`` after each. The loop is
        `Solver._fit` (a limit that stops the run short of ``infeasibility_tol`` warns: `ConvergenceWarning`;
        ``checkpoint``: resume from / write that file every ``checkpoint_every`` steps)."""
        return self._fit({"max_iter": max_iter, "time_budget": time_budget, "infeasibility_tol": infeasibility_tol},
                         callback=callback, checkpoint=checkpoint, checkpoint_every=checkpoint_every)

    def _done(self, r: dict, limits: dict, exact: bool) -> bool:
        tol = limits.get("infeasibility_tol")
        return super()._done(r, limits, exact) or (tol is not None and r["infeasibility"] <= tol and (
            r["gap_estimate"] is None or r["gap_estimate"] <= tol))

    # -- state (`Solver`) ------------------------------------------------------------------------
    _state_tensors = ("uidx", "uval", "bidx", "bval", "W", "v", "lam_L", "lam_R")
    _state_scalars = ("iterations",)
    _sparse_state = ("uidx", "uval", "bidx", "bval")  # padded active sets: their width may differ
    _block_orders = ("label_blocks",)  # random partitions of the sampled oracle, saved as one permutation

    def _extra_state(self) -> dict:
        # C is the objective's (C = 1 / (lam n)): a state of another is refused. rho and eta steer the run and certify
        # nothing: like a batch size they are the solver's, not the state's (a solver built with rho = 5 runs rho = 5)
        s = dict(seconds=self.seconds, fmo_calls=dict(self.fmo_calls), fmo_visits=dict(self.fmo_visits),
                 inner=dict(self.inner), generator=self.generator.get_state(), C=self.C, eta_total=self.eta_total)
        s.update((k, torch.cat(getattr(self, k))) for k in self._block_orders)
        return s

    def _state_shape(self, key: str, state: dict) -> tuple:
        cur, new = getattr(self, key), state[key]
        if key in self._sparse_state and isinstance(new, torch.Tensor) and new.dim() == cur.dim():
            return (cur.shape[0], *new.shape[1:])  # the active sets' saved width
        return tuple(cur.shape)

    def _checked_blocks(self, name: str, order) -> tuple:
        cur = torch.cat(getattr(self, name))
        if not isinstance(order, torch.Tensor) or order.shape != cur.shape or not torch.equal(
                order.sort().values.cpu(), cur.sort().values.cpu()):
            raise ValueError(f"state_dict[{name!r}] is not a permutation of this problem's {cur.numel()} ids")
        return order.to(cur.device).tensor_split(self.nu)

    def _checked_state(self, state: dict) -> dict:
        """Also the state's C (this solver's, within rounding), counters, block orders and generator. The solver's
        own rho and eta stay; ``eta_total``, the sum of the etas the multipliers were stepped with, comes with the
        state (a state saved before it recorded it: its ``eta`` times its iterations)."""
        require_keys(state, ("generator",))
        out = super()._checked_state(state)
        out.update({k: self._checked_blocks(k, state[k]) for k in self._block_orders if k in state})
        C = check_positive_float("state_dict['C']", state.get("C", self.C))
        if not math.isclose(C, self.C, rel_tol=1e-12):  # lam and C convert into each other with a rounding
            raise ValueError(f"state_dict was saved with C = {C!r} (lam = {1.0 / (C * self.n)!r}); this solver has "
                             f"C = {self.C!r} (lam = {self.lam!r}): its duals are of another objective")
        out["C"] = self.C
        older = {} if "eta_total" in state else {"eta_total": check_real("state_dict['eta']", state.get("eta", 0.0))
                                                 * out["iterations"]}
        out.update(checked_scalars({"seconds": 0.0, **state, **older}, {"seconds": float, "eta_total": float}))
        for key in ("eta_total", "seconds"):
            if not (out[key] >= 0 and math.isfinite(out[key])):
                raise ValueError(f"state_dict[{key!r}] must be a finite number >= 0, got {out[key]!r}")
        for key in ("fmo_calls", "fmo_visits", "inner"):
            counts = state.get(key, getattr(self, key))
            if not isinstance(counts, dict) or set(counts) != set(getattr(self, key)) or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in counts.values()):
                raise ValueError(f"state_dict[{key!r}] must map {sorted(getattr(self, key))} to counts >= 0")
        out.update({k: dict(state.get(k, getattr(self, k))) for k in ("fmo_calls", "fmo_visits", "inner")})
        out["_generator"] = checked_generator_state(state)
        return out

    def _data(self) -> dict:
        return self.problem.fingerprint_data()

    # the rounding of the incremental updates of the primal tables, relative to their scale (a dropped entry,
    # |alpha| <= drop_tol <= 1e-9, leaves the tables but not the duals: also within it)
    consistency_rtol = 1e-8

    @staticmethod
    def _check_shifted_simplex(key: str, idx: Optional[torch.Tensor], val: torch.Tensor, width: int, C: float,
                               top: Optional[torch.Tensor] = None) -> None:
        """Rows of ``val`` (padded active sets ``idx``, the truth in slot 0; or dense rows with the truth at
        ``top``) on the shifted simplex of eq. 11: the truth's entry in ``[0, C]``, the others ``<= 0``, sum 0;
        active ids distinct and in ``[0, width)``, free slots (-1) holding 0."""
        tol = 1e-9 * C
        if idx is not None:
            ok = (idx >= -1) & (idx < width)
            if not bool(ok.all()):
                raise ValueError(f"state_dict[{key[0] + 'idx'!r}] holds ids outside [-1, {width})")
            if idx.shape[1] > 1:
                srt = idx.sort(1).values
                if bool(((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any()):
                    raise ValueError(f"state_dict[{key[0] + 'idx'!r}] repeats an id in an active set")
            check_range(key, val.masked_fill(idx >= 0, 0.0), 0.0, 0.0, what="free slots hold 0")
            first, rest = val[:, 0], val[:, 1:]
        else:
            first = val.gather(-1, top.unsqueeze(-1)).squeeze(-1)
            rest = val.scatter(-1, top.unsqueeze(-1), 0.0)
        check_range(key, first, 0.0, C, tol=tol, what="the truth's dual lies in [0, C]")
        check_range(key, rest, -math.inf, 0.0, tol=tol, what="the other duals are <= 0")
        check_range(key, val.sum(-1), 0.0, 0.0, tol=tol * 10, what="a factor's duals sum to 0")

    @torch.no_grad()
    def _check_consistency(self, c: dict) -> None:
        """The duals on their shifted simplices (eq. 11), the truth in slot 0 of each active set; the primal tables
        recomputed from them, ``W = sum_t x_t alpha_t^T`` and ``v = sum_e beta_e``; the multipliers: 0 with
        ``eta_total = 0``, else each row summing to 0 (a sum of eta times residuals of two vectors that sum to 0),
        bounded by ``4 C eta_total`` (`_check_multipliers`).
        Any such multiplier is a valid state: it steers the run and certifies nothing."""
        C, K = c["C"], self.K
        uidx, uval, bidx, bval = c["uidx"], c["uval"], c["bidx"], c["bval"]
        if not torch.equal(uidx[:, 0], self.y) or not torch.equal(bidx[:, 0], self.ybig):
            raise ValueError("state_dict['uidx'] / ['bidx'] must hold the truth in slot 0 of every active set")
        self._check_shifted_simplex("uval", uidx, uval, K, C)
        self._check_shifted_simplex("bval", bidx, bval, K * K, C)
        W = torch.zeros_like(self.W)
        for s in range(0, self.N, 4096):
            tok = torch.arange(s, min(s + 4096, self.N), device=self.device)
            dense = self._dense(uidx[tok], uval[tok], K)
            if self.x is not None:
                W.add_(self.x[tok].t() @ dense)
            else:
                ids, vals = self.x_ids[tok], self.x_vals[tok]
                W.index_add_(0, ids.clamp_min(0).reshape(-1), (vals.unsqueeze(2) * dense.unsqueeze(1)).reshape(-1, K))
        ok = bidx >= 0
        v = torch.zeros(K * K, dtype=torch.float64, device=self.device).index_add_(0, bidx[ok], bval[ok]).view(K, K)
        if self.x is not None:
            colsum = self.x.abs().sum(0)
        else:
            ok = self.x_ids >= 0
            colsum = torch.zeros(self.Dx, dtype=torch.float64, device=self.device).index_add_(
                0, self.x_ids[ok], self.x_vals[ok].abs())
        drops = self.drop_tol * c["iterations"]
        self._check_tables(c, {"W": W, "v": v}, C, {"W": drops * uidx.shape[1] * float(colsum.max()),
                                                    "v": drops * bidx.shape[1] * self.E})
        self._check_multipliers(c, ("lam_L", "lam_R"), rows_sum_zero=True)

    def _check_tables(self, c: dict, recomputed: dict, C: float, dropped: dict) -> None:
        """``c[key]`` equal to ``recomputed[key]`` to rounding, plus ``dropped[key]``: a bound on what the entries
        dropped from the active sets (each at most ``drop_tol``, once per iteration and slot) left in the table."""
        for key, rec in recomputed.items():
            scale = max(float(rec.abs().max()) if rec.numel() else 0.0, C)
            rtol = self.consistency_rtol + dropped[key] / scale
            check_close(key, c[key], rec, scale, rtol, "the duals it is the sum of")

    def _check_multipliers(self, c: dict, keys: tuple, rows_sum_zero: bool) -> None:
        """Each multiplier is a sum over the iterations of their eta times a residual of L1 norm at most ``4 C`` (both
        sides of the constraint have L1 norm at most ``2 C``): bounded by ``4 C eta_total``."""
        for key in keys:
            t = c[key]
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"state_dict[{key!r}] holds Inf: the state is corrupt")
            scale = max(float(t.abs().max()) if t.numel() else 0.0, c["C"])
            top = 4.0 * c["C"] * c["eta_total"]
            check_range(key, t.abs().sum(-1) if rows_sum_zero else t.abs(), 0.0, top, tol=1e-9 * top,
                        what="the sum of eta times the iterations' residuals, each of L1 norm <= 4 C")
            if c["eta_total"] == 0:
                check_range(key, t, 0.0, 0.0, what="eta = 0 at every iteration (Soft-BCFW): the multipliers stay 0")
            elif rows_sum_zero and t.numel():
                check_range(key, t.sum(-1), 0.0, 0.0, tol=1e-9 * scale * t.shape[-1],
                            what="each row sums to 0 (eta times residuals that sum to 0)")

    def _set_state(self, checked: dict) -> None:
        self.generator.set_state(checked.pop("_generator"))
        super()._set_state(checked)
        if self.index is not None:
            self.index = BigramIndex(self.v)
        self._write_model()
