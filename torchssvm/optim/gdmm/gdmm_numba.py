"""The sequential (Gauss-Seidel, ``batch_size=1``) passes of chain GDMM as compiled CPU loops (numba).

The tensor code of `gdmm.GDMM` updates one factor per batch at ``batch_size=1`` with some 60 small torch
ops: about 100 us of per-op overhead for a few thousand flops of work (POS: ``K = 44`` labels, about 30
features per token). These loops run the same updates, in the same order (the permutations drawn by
`GDMM._passes` from the solver's generator), on the same state tensors (through numpy views, in place):

- unigram factor t: the messages ``m_R[left edge] + m_L[right edge]``, the gradient
  ``g_t = <w_k, x_t> + delta_t [k != y_t] - rho msg``, the exact FMO over the labels outside the active set,
  the add test, the projected step onto the shifted simplex on the active set with
  ``Q = ||x_t||^2 + rho deg_t + 1e-12`` (the exact block minimizer), ``W += x_t d^T``, the drop of tiny entries;
- bigram factor e: ``m_L``, ``m_R``, the brute-force FMO over the ``K^2`` pairs, the add test, then either the
  exact block minimization on the active set (`_exact_block`: the active-set method of `shifted_simplex_qp`
  on the compact face, the same face changes in the same order) or the projected step with
  ``Q = 1 + rho (max row count + max column count)``; ``v += d``, the drop.

Only the floating-point summation order differs from the tensor code (for instance ``x_t^T W`` by a loop
instead of BLAS), so both give the same iterates up to rounding; `tests/test_gdmm_numba.py` checks it.
A factor whose active set is full (no free slot) stops the pass; the caller widens the state and resumes
at that factor, which has not been touched (the tensor code widens the same way, doubling the width).
"""

from __future__ import annotations

import numpy as np

from ...kernels import _numba

_jit = _numba.jit()


def available() -> bool:
    return _numba.available()


@_jit
def _project_shifted(u, n, C, out, b, srt):
    """``out[:n]``: the projection of ``u[:n]`` onto ``{a_0 <= C, a_j <= 0 (j > 0), sum a = 0}`` (entry 0 is
    the truth), as `kernels.project_shifted_simplex`: ``b = cap - u`` onto the simplex of radius C by the
    sort rule, then ``a = cap - b``. ``b``, ``srt``: scratch of length >= n."""
    for j in range(n):
        b[j] = (C if j == 0 else 0.0) - u[j]
    srt[:n] = -np.sort(-b[:n])  # decreasing
    css = 0.0
    css_rho = 0.0
    rho = 1
    for j in range(n):
        css += srt[j]
        if srt[j] * (j + 1) > css - C:
            rho = j + 1
            css_rho = css
    tau = (css_rho - C) / rho
    for j in range(n):
        out[j] = (C if j == 0 else 0.0) - max(b[j] - tau, 0.0)


@_jit
def _first_free(idx_row):
    for j in range(idx_row.shape[0]):
        if idx_row[j] < 0:
            return j
    return -1


@_jit
def _append(idx, val, g, cap, slots, n, new, g_new):
    """Put ``new`` (gradient ``g_new``, value 0, cap 0) into the first free slot of the row, keeping ``slots[:n]``
    increasing (the tensor code's order). Returns the new active count, or -1 if the row is full (untouched)."""
    j = _first_free(idx)
    if j < 0:
        return -1
    idx[j] = new
    val[j] = 0.0
    g[j] = g_new
    cap[j] = 0.0
    ins = n
    while ins > 0 and slots[ins - 1] > j:
        slots[ins] = slots[ins - 1]
        ins -= 1
    slots[ins] = j
    return n + 1


@_jit
def _max_shared(idx, slots, n, K, by_row, cnt):
    """The largest number of active pairs ``k1 K + k2`` sharing one row k1 (``by_row``) or one column k2.
    ``cnt (K,)``: zeros in and out."""
    m = 0
    for a in range(n):
        cnt[idx[slots[a]] // K if by_row else idx[slots[a]] % K] += 1
    for a in range(n):
        m = max(m, cnt[idx[slots[a]] // K if by_row else idx[slots[a]] % K])
    for a in range(n):
        cnt[idx[slots[a]] // K if by_row else idx[slots[a]] % K] = 0
    return m


@_jit
def _add_test(g, val, cap, slots, n, g_new):
    """A new coordinate helps when its gradient exceeds that of an active one with room to grow
    (`GDMM._add_test`)."""
    g_min = np.inf
    for a in range(n):
        j = slots[a]
        if val[j] < cap[j] - 1e-15 and g[j] < g_min:
            g_min = g[j]
    return np.isfinite(g_new) and g_new > g_min + 1e-12 * (1.0 + abs(g_min))


@_jit
def _alpha_dense(uidx, uval, t, out):
    out[:] = 0.0
    for j in range(uidx.shape[1]):
        k = uidx[t, j]
        if k >= 0:
            out[k] += uval[t, j]


@_jit
def _pair_sums(bidx, bval, e, K, rows, cols):
    rows[:] = 0.0
    cols[:] = 0.0
    for j in range(bidx.shape[1]):
        p = bidx[e, j]
        if p >= 0:
            rows[p // K] += bval[e, j]
            cols[p % K] += bval[e, j]


@_jit
def _prox(val, g, slots, n, Q, C, d, u, newv, b, srt):
    """The projected step on the active set: ``d[slots[:n]]``, the step to the projection of ``val - g / Q``
    (slot 0, the first active one, is the truth). ``u, newv, b, srt``: scratch of length >= n."""
    for a in range(n):
        j = slots[a]
        u[a] = val[j] - g[j] / Q
    _project_shifted(u, n, C, newv, b, srt)
    for a in range(n):
        j = slots[a]
        d[j] = newv[a] - val[j]


@_jit
def _store(idx, val, d, slots, n, drop_tol):
    for a in range(n):
        j = slots[a]
        val[j] = val[j] + d[j]
        if j > 0 and abs(val[j]) <= drop_tol:
            idx[j] = -1
            val[j] = 0.0


@_jit
def _solve(A, rhs, n, out):
    """``out[:n] = A[:n, :n]^-1 rhs[:n]`` by Gaussian elimination with partial pivoting (``A``, ``rhs``
    overwritten)."""
    for col in range(n):
        piv = col
        best = abs(A[col, col])
        for r in range(col + 1, n):
            if abs(A[r, col]) > best:
                best = abs(A[r, col])
                piv = r
        if piv != col:
            for c2 in range(n):
                A[col, c2], A[piv, c2] = A[piv, c2], A[col, c2]
            rhs[col], rhs[piv] = rhs[piv], rhs[col]
        inv = 1.0 / A[col, col]
        for r in range(col + 1, n):
            f = A[r, col] * inv
            if f != 0.0:
                for c2 in range(col, n):
                    A[r, c2] -= f * A[col, c2]
                rhs[r] -= f * rhs[col]
    for r in range(n - 1, -1, -1):
        acc = rhs[r]
        for c2 in range(r + 1, n):
            acc -= A[r, c2] * out[c2]
        out[r] = acc / A[r, r]


@_jit
def _exact_block(val, g, slots, n, C, Hn, d, u0, u, c, p, gu, free, fl, A, rhs, sol, max_iter):
    """``d[slots[:n]]``: the step to the exact minimizer of ``g^T d + 1/2 d^T Hn d`` over the shifted simplex on
    the active slots (entry 0 the truth): `shifted_simplex_qp`'s active-set method on ``u = cap - val``, one
    compact KKT solve per face. ``Hn (>= n, >= n)`` holds the Hessian over the active entries in slot order;
    the rest are scratch. Returns the number of face changes."""
    for a in range(n):
        u0[a] = (C if a == 0 else 0.0) - val[slots[a]]
        u[a] = u0[a]
        free[a] = u[a] > 0.0
    hmax = 0.0
    cmax = 0.0
    for a in range(n):
        acc = g[slots[a]]
        for b in range(n):
            acc += Hn[a, b] * u0[b]
            hmax = max(hmax, abs(Hn[a, b]))
        c[a] = acc
        cmax = max(cmax, abs(acc))
    tiny = 1e-14 * (1.0 + hmax * C + cmax)
    it = 0
    while it < max_iter:
        it += 1
        nf = 0
        for a in range(n):
            if free[a]:
                fl[nf] = a
                nf += 1
        for i in range(nf):
            for k in range(nf):
                A[i, k] = Hn[fl[i], fl[k]]
            A[i, nf] = 1.0
            A[nf, i] = 1.0
            rhs[i] = c[fl[i]]
        A[nf, nf] = 0.0
        rhs[nf] = C
        _solve(A, rhs, nf + 1, sol)
        s_max = np.inf
        for i in range(nf):
            a = fl[i]
            p[a] = sol[i] - u[a]
            gu[a] = u[a] / max(-p[a], 1e-300) if p[a] < 0.0 else np.inf  # the ratio test
            if gu[a] < s_max:
                s_max = gu[a]
        if s_max < 1.0:  # blocked: the first coordinates to reach 0 leave the face
            for i in range(nf):
                a = fl[i]
                u[a] = max(u[a] + s_max * p[a], 0.0)
                if p[a] < 0.0 and gu[a] <= s_max * (1 + 1e-12):
                    u[a] = 0.0
                    free[a] = False
            continue
        for i in range(nf):
            a = fl[i]
            u[a] = max(u[a] + p[a], 0.0)
        nu = 0.0
        for a in range(n):
            acc = -c[a]
            for b in range(n):
                acc += Hn[a, b] * u[b]
            gu[a] = acc
            if free[a]:
                nu += acc
        nu /= nf
        j_in = -1
        g_in = np.inf
        for a in range(n):
            if not free[a] and gu[a] < g_in:
                g_in = gu[a]
                j_in = a
        if j_in >= 0 and g_in < nu - tiny:
            free[j_in] = True
        else:
            break
    for a in range(n):
        d[slots[a]] = u0[a] - u[a]
    return it


@_jit
def token_pass(order, start, uidx, uval, bidx, bval, W, v, lam_L, lam_R, x_ids, x_vals, x_sqnorm, deg, y, delta,
               tok_left_edge, tok_right_edge, C, rho, drop_tol):
    """Unigram factors ``order[start:]`` one after the other. Returns the position in ``order`` of the first
    factor whose active set is full (untouched; widen ``uidx``/``uval`` and resume there), or ``len(order)``."""
    K = W.shape[1]
    N = order.shape[0]
    cu = uidx.shape[1]
    alpha = np.empty(K)
    tmp_r = np.empty(K)
    tmp_c = np.empty(K)
    msg = np.empty(K)
    gall = np.empty(K)
    inact = np.zeros(K, dtype=np.bool_)
    g = np.empty(cu)
    cap = np.empty(cu)
    d = np.zeros(cu)
    slots = np.empty(cu, dtype=np.int64)
    u, newv, b, srt = np.empty(cu), np.empty(cu), np.empty(cu), np.empty(cu)
    for pos in range(start, N):
        t = order[pos]
        yt = y[t]
        _alpha_dense(uidx, uval, t, alpha)
        msg[:] = 0.0
        el = tok_left_edge[t]
        if el >= 0:
            _pair_sums(bidx, bval, el, K, tmp_r, tmp_c)
            for k in range(K):
                msg[k] += tmp_c[k] + lam_R[el, k] - alpha[k]
        er = tok_right_edge[t]
        if er >= 0:
            _pair_sums(bidx, bval, er, K, tmp_r, tmp_c)
            for k in range(K):
                msg[k] += tmp_r[k] + lam_L[er, k] - alpha[k]
        gall[:] = 0.0
        for a in range(x_ids.shape[1]):
            f = x_ids[t, a]
            if f >= 0:
                xv = x_vals[t, a]
                for k in range(K):
                    gall[k] += W[f, k] * xv
        dl = delta[t]
        for k in range(K):
            gall[k] = gall[k] + (dl if k != yt else 0.0) - rho * msg[k]
        n = 0
        for j in range(cu):
            k = uidx[t, j]
            if k >= 0:
                slots[n] = j
                n += 1
                inact[k] = True
                g[j] = gall[k]
                cap[j] = C if k == yt else 0.0
        inact[yt] = True
        g_new = -np.inf
        k_new = -1
        for k in range(K):
            if not inact[k] and gall[k] > g_new:
                g_new = gall[k]
                k_new = k
        for j in range(cu):
            if uidx[t, j] >= 0:
                inact[uidx[t, j]] = False
        inact[yt] = False
        if _add_test(g, uval[t], cap, slots, n, g_new):
            n = _append(uidx[t], uval[t], g, cap, slots, n, k_new, g_new)
            if n < 0:
                return pos
        Q = x_sqnorm[t] + rho * deg[t] + 1e-12
        _prox(uval[t], g, slots, n, Q, C, d, u, newv, b, srt)
        for a in range(x_ids.shape[1]):
            f = x_ids[t, a]
            if f >= 0:
                xv = x_vals[t, a]
                for s in range(n):
                    j = slots[s]
                    W[f, uidx[t, j]] += xv * d[j]
        _store(uidx[t], uval[t], d, slots, n, drop_tol)
    return N


@_jit
def edge_pass(order, start, uidx, uval, bidx, bval, v, lam_L, lam_R, edge_left, edge_right, ybig, C, rho, drop_tol,
              exact, inner):
    """Bigram factors ``order[start:]`` one after the other (brute-force FMO over the K^2 pairs), by the exact
    block minimization (``exact``; ``inner[0]`` counts its face changes) or one projected step. Returns the
    position of the first factor whose active set is full (untouched), or ``len(order)``."""
    K = v.shape[0]
    E = order.shape[0]
    cb = bidx.shape[1]
    aL = np.empty(K)
    aR = np.empty(K)
    rs = np.empty(K)
    cs = np.empty(K)
    mL = np.empty(K)
    mR = np.empty(K)
    excl = np.zeros(K * K, dtype=np.bool_)
    g = np.empty(cb)
    cap = np.empty(cb)
    d = np.zeros(cb)
    slots = np.empty(cb, dtype=np.int64)
    u, newv, b, srt = np.empty(cb), np.empty(cb), np.empty(cb), np.empty(cb)
    cnt = np.zeros(K, dtype=np.int64)
    Hn = np.empty((cb, cb))
    u0, uu, c, pp, gu = np.empty(cb), np.empty(cb), np.empty(cb), np.empty(cb), np.empty(cb)
    free = np.empty(cb, dtype=np.bool_)
    fl = np.empty(cb, dtype=np.int64)
    A = np.empty((cb + 1, cb + 1))
    rhs, sol = np.empty(cb + 1), np.empty(cb + 1)
    for pos in range(start, E):
        e = order[pos]
        top = ybig[e]
        _alpha_dense(uidx, uval, edge_left[e], aL)
        _alpha_dense(uidx, uval, edge_right[e], aR)
        _pair_sums(bidx, bval, e, K, rs, cs)
        for k in range(K):
            mL[k] = rs[k] - aL[k] + lam_L[e, k]
            mR[k] = cs[k] - aR[k] + lam_R[e, k]
        n = 0
        for j in range(cb):
            p = bidx[e, j]
            if p >= 0:
                slots[n] = j
                n += 1
                excl[p] = True
                g[j] = v[p // K, p % K] + rho * (mL[p // K] + mR[p % K])
                cap[j] = C if p == top else 0.0
        g_new = -np.inf
        p_new = -1
        for k1 in range(K):
            for k2 in range(K):
                p = k1 * K + k2
                if not excl[p]:
                    val = (mL[k1] + mR[k2]) * rho + v[k1, k2]
                    if val > g_new:
                        g_new = val
                        p_new = p
        for j in range(cb):
            if bidx[e, j] >= 0:
                excl[bidx[e, j]] = False
        if p_new >= 0 and _add_test(g, bval[e], cap, slots, n, g_new):
            n = _append(bidx[e], bval[e], g, cap, slots, n, p_new, g_new)
            if n < 0:
                return pos
        if exact:  # the block Hessian I + rho ([same row] + [same column]) over the active pairs
            for a in range(n):
                pa = bidx[e, slots[a]]
                for b2 in range(n):
                    pb = bidx[e, slots[b2]]
                    Hn[a, b2] = (1.0 if a == b2 else 0.0) + rho * ((1.0 if pa // K == pb // K else 0.0)
                                                                  + (1.0 if pa % K == pb % K else 0.0))
            inner[0] += _exact_block(bval[e], g, slots, n, C, Hn, d, u0, uu, c, pp, gu, free, fl, A, rhs, sol,
                                     4 * cb + 10)
        else:  # Q = 1 + rho (max pairs sharing a row + max pairs sharing a column), over the active set
            rmax = _max_shared(bidx[e], slots, n, K, True, cnt)
            cmax = _max_shared(bidx[e], slots, n, K, False, cnt)
            Q = 1.0 + rho * (rmax + cmax)
            _prox(bval[e], g, slots, n, Q, C, d, u, newv, b, srt)
        for s in range(n):
            j = slots[s]
            p = bidx[e, j]
            v[p // K, p % K] += d[j]
        _store(bidx[e], bval[e], d, slots, n, drop_tol)
    return E
