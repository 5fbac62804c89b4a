"""Pegasos (Shalev-Shwartz et al.): stochastic subgradient descent on ``lam/2 ||w||^2 + mean loss``, as a
``torch.optim`` optimizer over any parameters and any loss (margin- or slack-rescaled hinge; Choi et al.,
2016, section 3, train the slack-rescaled objective this way).

Step t (from 1): ``w <- w - eta_t (lam w + grad)`` with ``eta_t = 1 / (lam t)``, i.e.
``w <- (1 - 1/t) w - grad / (lam t)``; ``grad`` is the mini-batch subgradient of the mean loss that
``loss.backward()`` left in ``.grad``. Optional projection onto the ball of radius ``1 / sqrt(lam)``
(Pegasos' projection step, which holds the optimum when the loss is at most 1 at ``w = 0``) and the
running average of the iterates ``avg <- avg + (w - avg) / t`` (read with `averaged`).

Why it is a ``torch.optim.Optimizer`` and not a `torchssvm.optim.Solver`: it owns no problem and no loop. The
user's loop computes any loss on any model (a network's outputs included), calls ``backward()`` and then
``step()``; the optimizer only updates parameters from their ``.grad``, with PyTorch's ``state_dict``, param groups
and schedulers. A `Solver` owns its problem (an oracle over the training set), so that its reports can carry a
primal / dual / gap and its ``fit`` can stop on them; `SSG` is the same Pegasos schedule in that form.
"""

from __future__ import annotations

import math

import torch


class Pegasos(torch.optim.Optimizer):
    """``opt = Pegasos(params, lam=1e-3)``; after ``loss.backward()``, ``opt.step()``.

    Args:
        params: parameters (the regularizer covers all of them; put unregularized ones elsewhere).
        lam: the regularization ``lam > 0``.
        project: project onto ``||w|| <= 1 / sqrt(lam)`` (over all parameters of the group) after a step.
        average: keep the running average of the iterates in the state (``averaged()`` swaps it in).
    """

    def __init__(self, params, lam: float, *, project: bool = False, average: bool = False):
        if not (isinstance(lam, (int, float)) and lam > 0 and math.isfinite(lam)):
            raise ValueError(f"lam must be a finite number > 0, got {lam!r}")
        super().__init__(params, {"lam": float(lam), "project": bool(project), "average": bool(average)})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lam = group["lam"]
            t = group["t"] = group.get("t", 0) + 1  # kept in the group: saved by state_dict()
            params = list(group["params"])
            for p in params:
                p.mul_(1.0 - 1.0 / t)
                if p.grad is not None:
                    p.add_(p.grad, alpha=-1.0 / (lam * t))
            if group["project"]:
                norm = torch.sqrt(sum((p * p).sum() for p in params))
                radius = 1.0 / math.sqrt(lam)
                if float(norm) > radius:
                    for p in params:
                        p.mul_(radius / float(norm))
            if group["average"]:
                for p in params:
                    avg = self.state[p].setdefault("average", torch.zeros_like(p))
                    avg.add_(p - avg, alpha=1.0 / t)
        return loss

    def averaged(self):
        """Swap every parameter with its running average (call again to swap back)."""
        for group in self.param_groups:  # checked before anything is swapped
            if not group["average"]:
                raise ValueError("averaged() needs Pegasos(..., average=True)")
            if any("average" not in self.state[p] for p in group["params"]):
                raise RuntimeError("averaged() needs a step() of every parameter group first: there is no average "
                                   "yet")
        for group in self.param_groups:
            for p in group["params"]:
                avg = self.state[p]["average"]
                tmp = p.detach().clone()
                p.data.copy_(avg)
                avg.copy_(tmp)
