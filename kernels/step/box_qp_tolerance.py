"""The box QP's stop test floor, shared by its device iterations (`box_qp_torch`, `box_qp_triton`) and the
host's (``optim.frank_wolfe.box_qp``'s numpy iteration, its compiled twin ``box_qp_numba``), below all of them.

The Newton systems carry a ridge r (relative 1e-13 to H's diagonal), so the free coordinates' gradient is not
resolved below about r max(gamma): the stop test allows `RIDGE_FLOOR` times that on top of tol max|c|. Without it
the iteration can run to max_iter on late-training BCFW QPs (one is recorded in tests/fixtures), each iteration
gaining less than 1e-13 of f.
"""

RIDGE_FLOOR = 100.0
