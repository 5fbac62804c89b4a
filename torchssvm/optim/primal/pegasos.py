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

    def load_state_dict(self, state_dict: dict) -> None:
        """``torch.optim.Optimizer.load_state_dict``, after checking the state (a ValueError naming the entry; a
        refused state leaves the optimizer unchanged): each group's ``lam``, ``project`` and ``average`` are this
        optimizer's (a state of another objective is not adopted); its step count ``t`` an int ``>= 0``; each
        running average a finite tensor of its parameter's shape and dtype, present only with ``average`` and
        after a step."""
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict or "state" not in state_dict:
            raise ValueError("state_dict must be a torch.optim state dict (with 'state' and 'param_groups')")
        saved = state_dict["param_groups"]
        if not isinstance(saved, list) or len(saved) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(saved) if isinstance(saved, list) else '?'} parameter groups; "
                             f"this optimizer has {len(self.param_groups)}")
        params = {}
        for i, (group, mine) in enumerate(zip(saved, self.param_groups)):
            for key in ("lam", "project", "average"):
                if group.get(key) != mine[key]:
                    raise ValueError(f"state_dict['param_groups'][{i}][{key!r}] = {group.get(key)!r}; this optimizer "
                                     f"has {mine[key]!r}")
            t = group.get("t", 0)
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"state_dict['param_groups'][{i}]['t'] must be an int >= 0, got {t!r}")
            ids = group.get("params", [])
            if len(ids) != len(mine["params"]):
                raise ValueError(f"state_dict['param_groups'][{i}] has {len(ids)} parameters, not "
                                 f"{len(mine['params'])}")
            params.update((pid, (p, mine["average"] and t > 0)) for pid, p in zip(ids, mine["params"]))
        for pid, entry in state_dict["state"].items():
            if pid not in params:
                raise ValueError(f"state_dict['state'] holds parameter {pid!r} of no group")
            p, allowed = params[pid]
            avg = entry.get("average") if isinstance(entry, dict) else None
            if avg is None:
                continue
            if not allowed:
                raise ValueError(f"state_dict['state'][{pid!r}] holds an average without average=True and a step")
            if not isinstance(avg, torch.Tensor) or avg.shape != p.shape or avg.dtype != p.dtype:
                raise ValueError(f"state_dict['state'][{pid!r}]['average'] must be a {p.dtype} tensor of shape "
                                 f"{tuple(p.shape)}")
            if not bool(torch.isfinite(avg).all()):
                raise ValueError(f"state_dict['state'][{pid!r}]['average'] holds NaN or Inf")
        super().load_state_dict(state_dict)

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
