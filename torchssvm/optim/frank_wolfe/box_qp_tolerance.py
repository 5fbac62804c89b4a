"""The box QP's stop test floor, shared by its torch / numpy iteration (`box_qp`) and its compiled twin
(`box_qp_numba`), which imports nothing from `box_qp` (that module loads the twin only when a QP first runs).

The Newton systems carry a ridge r (relative 1e-13 to H's diagonal), so the free coordinates' gradient is not
resolved below about r max(gamma): the stop test allows `RIDGE_FLOOR` times that on top of tol max|c|. Without it
the compiled loop went on to max_iter on 6% of the late-training BCFW QPs we recorded (OCR-small, lam 1e-4,
B = 16), each iteration gaining less than 1e-13 of f; with it they stop in 2.0 iterations on average, as before
the test was made scale-free.
"""

RIDGE_FLOOR = 100.0
