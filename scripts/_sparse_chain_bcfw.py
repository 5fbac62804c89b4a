"""The faithful sequential BCFW (Lacoste-Julien et al. 2013, Alg. 4) for dense-feature chains with K in the
thousands: the BCFW baseline of `bench_gdmm.py` where the library's `BCFW` cannot hold its blocks.

`torchssvm.optim.BCFW` stores a block in marginal coordinates, ``T K + K^2 + 2K`` numbers: 9M at K = 3,000,
so a few hundred sequences do not fit. Here a block ``w_i`` lives in feature space, split as
``emission (D', K)`` dense (D' = D + bias / first / last indicators: small for low-dimensional features) and
``transition`` as a sparse set of label pairs (a convex combination of corners touches at most
``2 (T - 1)`` pairs per corner). Everything else is Alg. 4: one loss-augmented Viterbi call at the current
``w``, the corner ``w_s = psi / (lam n)``, ``l_s = L / n``, the closed-form line search, the block update.
Same model layout as `GDMM` (`GDMM.flat_w`), same objective as `torchssvm.optim.BCFW`.
"""

from __future__ import annotations

import time

import torch
from torchssvm.kernels import viterbi

from torchssvm.models import LinearChainModel
from torchssvm.optim.gdmm.gdmm import chain_w_from_tables
from torchssvm.optim.problems import ChainProblem


class SparseChainBCFW:
    """``SparseChainBCFW(model, dataset, lam, structure=None, seed=0)``; `step` is one pass (n blocks)."""

    def __init__(self, model: LinearChainModel, dataset, lam: float, *, structure=None, seed: int = 0):
        if model.sparse or model.bias_mode != "ocr":
            raise ValueError("SparseChainBCFW needs a dense LinearChainModel with bias='ocr'")
        self.problem = p = ChainProblem(model, dataset, structure, backend="torch")
        self.lam, self.n, self.K = float(lam), p.n, p.K
        K, f64 = self.K, torch.float64
        lengths = p.lengths
        T = p.T
        pos = torch.arange(T).unsqueeze(0).expand(p.n, T)
        valid = pos < lengths.unsqueeze(1)
        ones = valid.to(f64)
        self.x = torch.cat([p.x.to(f64) * ones.unsqueeze(2), ones.unsqueeze(2), (pos == 0).to(f64).unsqueeze(2),
                            (pos == lengths.unsqueeze(1) - 1).to(f64).unsqueeze(2)], 2)  # (n, T, D')
        self.Dx = self.x.shape[2]
        self.E = torch.zeros(p.n, self.Dx, K, dtype=f64)  # emission part of each block
        self.tidx = [torch.empty(0, dtype=torch.long) for _ in range(p.n)]  # transition part: flat pairs
        self.tval = [torch.empty(0, dtype=f64) for _ in range(p.n)]
        self.ell = torch.zeros(p.n, dtype=f64)
        self.W = torch.zeros(self.Dx, K, dtype=f64)
        self.v = torch.zeros(K, K, dtype=f64)
        self.zero = torch.zeros(K, dtype=f64)
        self.generator = torch.Generator().manual_seed(seed)
        torch.randperm(p.n, generator=self.generator)  # the draw `BCFW` makes at start: the same block order
        self.seconds, self.passes = 0.0, 0
        self.write_model()

    def _pairs(self, y: torch.Tensor) -> torch.Tensor:
        return y[:-1] * self.K + y[1:]

    @torch.no_grad()
    def _visit(self, i: int) -> None:
        p, K, lam, n = self.problem, self.K, self.lam, self.n
        Ti = int(p.lengths[i])
        x = self.x[i, :Ti]
        y = p.truth[i, :Ti]
        aug = p.loss_aug[i, :Ti]
        unary = (x @ self.W + aug).unsqueeze(0)
        y_hat = viterbi(unary, self.v, self.zero, self.zero, p.lengths[i:i + 1], backend="torch")[0][0, :Ti]
        loss = float(aug.gather(1, y_hat.unsqueeze(1)).sum())
        scale = 1.0 / (lam * n)
        diff = torch.zeros(Ti, K, dtype=torch.float64)
        diff[torch.arange(Ti), y] += 1.0
        diff[torch.arange(Ti), y_hat] -= 1.0
        Es = (x.t() @ diff) * scale
        sidx = torch.cat([self._pairs(y), self._pairs(y_hat)])
        sval = torch.cat([torch.full((Ti - 1,), scale, dtype=torch.float64),
                          torch.full((Ti - 1,), -scale, dtype=torch.float64)])
        ls = loss / n
        # d = w_i - w_s on the union of the two transition supports
        union, inv = torch.unique(torch.cat([self.tidx[i], sidx]), return_inverse=True)
        nb = self.tidx[i].numel()
        dT = torch.zeros(union.numel(), dtype=torch.float64)
        dT.index_add_(0, inv[:nb], self.tval[i])
        dT.index_add_(0, inv[nb:], -sval)
        dE = self.E[i] - Es
        vflat = self.v.view(-1)
        inner = float((dE * self.W).sum() + (dT * vflat[union]).sum())
        sq = float((dE * dE).sum() + (dT * dT).sum())
        gap = lam * inner - float(self.ell[i]) + ls
        gamma = 0.0 if sq <= 0 else min(max(gap / (lam * sq), 0.0), 1.0)
        if gamma == 0.0:
            return
        self.E[i] -= gamma * dE
        self.W -= gamma * dE
        vflat.index_add_(0, union, -gamma * dT)
        newT = torch.zeros(union.numel(), dtype=torch.float64)
        newT.index_add_(0, inv[:nb], self.tval[i])
        newT -= gamma * dT
        keep = newT != 0
        self.tidx[i], self.tval[i] = union[keep], newT[keep]
        self.ell[i] = (1 - gamma) * self.ell[i] + gamma * ls

    def write_model(self) -> None:
        self.problem.write_model(chain_w_from_tables(self.problem, self.W, self.v))

    def step(self) -> dict:
        t0 = time.perf_counter()
        for _ in range(self.n):  # uniform with replacement, drawn as `BCFW(sampling="uniform")` does
            self._visit(int(torch.randint(self.n, (1,), generator=self.generator)))
        self.passes += 1
        self.seconds += time.perf_counter() - t0
        self.write_model()
        return {"passes": self.passes, "dual": self.dual(), "time": self.seconds}

    def dual(self) -> float:
        return float(self.ell.sum()) - 0.5 * self.lam * float((self.W * self.W).sum() + (self.v * self.v).sum())

    def primal(self) -> float:
        return self.problem.primal(chain_w_from_tables(self.problem, self.W, self.v), self.lam)
