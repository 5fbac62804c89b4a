"""Training recipes: whole training runs as plain functions, the ones the ``torchssvm`` command runs.

Each takes the (train, test) datasets and the run's settings, trains, evaluates on both after every epoch (torch
optimizers) or pass (dual solvers), logs to TensorBoard when given a ``logdir``, and returns a `TrainingRun`: the
trained model, the solver, one metrics dict per epoch or pass, the log folder. They print nothing:
``callback(metrics)`` sees each epoch's or pass's metrics as they come.

- `train_chain_hinge`: a linear chain SSVM, the structured hinge loss by a torch optimizer.
- `train_chain_dual`: a linear chain SSVM by a dual solver (BCFW, batch Frank-Wolfe, SSG), with its duality gap.
- `train_pose_dual`: pictorial structures by a dual solver, with the positivity box.
- `train_pose_hinge`: pictorial structures, the hinge loss by a torch optimizer projected onto the box.
- `load_datasets`: the (train, test) pair of a name in `DATASETS`.

    import torchssvm as ts
    train, test = ts.recipes.load_datasets("synthetic")
    run = ts.recipes.train_chain_dual(train, test, solver="bcfw", lam=1e-2, passes=5, logdir=None)
    run.model, run.solver, run.metrics["gap"]
"""

from .chain_dual import train_chain_dual
from .chain_hinge import train_chain_hinge
from .datasets import DATASETS, load_datasets
from .pose_dual import train_pose_dual
from .pose_hinge import train_pose_hinge
from .run import DUAL_SOLVERS, OPTIMIZERS, TrainingRun, check_device

__all__ = ["train_chain_hinge", "train_chain_dual", "train_pose_dual", "train_pose_hinge", "load_datasets",
           "DATASETS", "DUAL_SOLVERS", "OPTIMIZERS", "TrainingRun", "check_device"]
