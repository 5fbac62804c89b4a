"""The box QP's stop test floor, shared by its torch / numpy iteration (`box_qp`) and its compiled twin
(`box_qp_numba`), which imports nothing from `box_qp` (that module loads the twin only when a QP first runs).

The Newton systems carry a ridge r (relative 1e-13 to H's diagonal), so the free coordinates' gradient is not
resolved below about r max(gamma): the stop test allows `RIDGE_FLOOR` times that on top of tol max|c|. Without it
the iteration can run to max_iter on late-training BCFW QPs (one is recorded in tests/fixtures), each iteration
gaining less than 1e-13 of f.
"""

RIDGE_FLOOR = 100.0
