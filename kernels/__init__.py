"""The kernels: each operation exists as a pure-torch twin and, where it pays, a Triton kernel (GPU) and a compiled
numba loop (CPU), chosen by ``backend=``.

One table, `backends.FORMS`, says which operation has which forms; `backends.resolve` picks the form for a
``backend`` string and a device (``"auto"``: Triton on CUDA, numba on the CPU where they exist, torch otherwise)
and refuses a form that does not exist. The kernels are grouped by family, one sub-package each: `chain` (Viterbi,
the scores of labellings and marginals, the slack-rescaled oracle, the fused hinge), `tree` (trees with tables,
pictorial structures and the distance transforms), `projections` (simplices, a box cut by an equality) and `step`
(the mini-batch BCFW step's bookkeeping); in each, every twin is its own ``*_torch``, ``*_triton`` or ``*_numba``
module and ``dispatch`` holds the family's dispatchers.

A new Triton kernel needs a workload and an `OUTPUTS` entry in `compile_check`, which compiles every kernel
for sm_80 and sm_90 without a GPU (the interpreter never builds one).
"""

from __future__ import annotations

from .backends import (
    BACKENDS,
    FORMS,
    check_backend,
    numba_available,
    resolve,
    resolve_backend,
    triton_available,
)
from .chain.chain_marginals_torch import chain_marginals_torch
from .chain.chain_score_torch import chain_inner_torch, chain_labels_score_torch, chain_score_torch
from .chain.dispatch import chain_inner, chain_labels_score, chain_marginals, slack_viterbi, viterbi
from .chain.slack_chain_torch import slack_viterbi_torch
from .chain.viterbi_torch import viterbi_torch
from .projections.box_equality_median import box_equality_median
from .projections.box_equality_torch import project_box_equality_torch
from .projections.dispatch import project_box_equality, project_shifted_simplex, project_simplex
from .projections.simplex_torch import project_simplex_torch
from .step.atoms_select_torch import select_atoms_torch
from .step.block_step_torch import apply_block_step_torch
from .step.box_qp_torch import projected_newton_torch
from .step.dispatch import apply_block_step, box_qp_newton, sampling_keys, select_atoms
from .step.sampling_torch import sampling_keys_torch
from .tree.dispatch import (
    check_quadratic_weights,
    distance_transform_1d,
    distance_transform_2d,
    mixture_tree_max_sum,
    spatial_tree_max_sum,
    tree_max_sum,
)
from .tree.distance_transform_torch import distance_transform_1d_torch
from .tree.tree_torch import (
    TreeSchedule,
    cooccurrence_tree_max_sum_torch,
    mixture_tree_max_sum_torch,
    spatial_tree_max_sum_torch,
    tree_max_sum_torch,
    tree_schedule,
)

__all__ = ["project_simplex", "project_shifted_simplex", "project_simplex_torch", "project_box_equality",
           "project_box_equality_torch", "box_equality_median",
           "viterbi", "viterbi_torch", "chain_score_torch", "chain_labels_score", "chain_labels_score_torch",
           "chain_inner", "chain_inner_torch",
           "chain_marginals", "chain_marginals_torch", "select_atoms", "select_atoms_torch", "apply_block_step",
           "apply_block_step_torch", "box_qp_newton", "projected_newton_torch", "sampling_keys",
           "sampling_keys_torch", "slack_viterbi",
           "slack_viterbi_torch", "resolve_backend", "resolve", "check_backend", "FORMS",
           "triton_available", "numba_available",
           "BACKENDS", "tree_max_sum", "tree_max_sum_torch", "spatial_tree_max_sum", "spatial_tree_max_sum_torch",
           "mixture_tree_max_sum", "mixture_tree_max_sum_torch", "cooccurrence_tree_max_sum_torch",
           "tree_schedule", "TreeSchedule", "distance_transform_1d", "distance_transform_1d_torch",
           "distance_transform_2d", "check_quadratic_weights"]
