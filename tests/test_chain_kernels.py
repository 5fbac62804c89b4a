"""The chain SSVM's bookkeeping kernels: labelling scores, scores of flat marginals and flat one-hot marginals,
torch twin against explicit sums and `Chain.marginals`, the Triton kernels and the numba twins against it, and the
problem's solver on each backend."""

import pytest
import torch
from conftest import needs_numba, needs_triton
from torchssvm.kernels import chain_inner, chain_labels_score, chain_marginals, chain_score_torch

import torchssvm as ts
from torchssvm.structures import Chain


def _lengths(B, T, g):
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = T, 1
    return lengths


def _labellings(B, C, T, K, lengths, g, width=None):
    y = torch.randint(0, K, (B, C, width or T), generator=g)
    y[(torch.arange(width or T) >= lengths.view(B, 1, 1)).expand(B, C, width or T)] = -1
    return y


def _potentials(B, T, K, g, start_end=True):
    draw = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return draw(B, T, K), draw(K, K), draw(K) if start_end else None, draw(K) if start_end else None


def _explicit_score(unary, transition, start, end, y, L):
    s = sum(float(unary[t, y[t]]) for t in range(L)) + sum(float(transition[y[t - 1], y[t]]) for t in range(1, L))
    return s + (float(start[y[0]]) if start is not None else 0.0) + (float(end[y[L - 1]]) if end is not None else 0.0)


@pytest.mark.parametrize("start_end", [True, False])
def test_labels_score_twin_is_the_explicit_sum(start_end):
    g = torch.Generator().manual_seed(0)
    B, C, T, K = 6, 3, 5, 4
    lengths = _lengths(B, T, g)
    theta = _potentials(B, T, K, g, start_end)
    y = _labellings(B, C, T, K, lengths, g, width=T + 2)  # wider than the potentials: the first T entries count
    got = chain_labels_score(*theta, y, lengths, backend="torch")
    assert got.shape == (B, C)
    for b in range(B):
        for c in range(C):
            ref = _explicit_score(theta[0][b], *theta[1:], y[b, c].tolist(), int(lengths[b]))
            assert float(got[b, c]) == pytest.approx(ref, abs=1e-12)
    # one labelling per example is Chain's score, per-position transitions included
    per_position = torch.randn(B, T - 1, K, K, generator=g, dtype=torch.float64)
    one = chain_score_torch(theta[0], per_position, theta[2], theta[3], y[:, 0, :T], lengths)
    for b in range(B):
        L, yb = int(lengths[b]), y[b, 0].tolist()
        ref = _explicit_score(theta[0][b], torch.zeros(K, K), *theta[2:], yb, L)
        ref += sum(float(per_position[b, t - 1, yb[t - 1], yb[t]]) for t in range(1, L))
        assert float(one[b]) == pytest.approx(ref, abs=1e-12)


def _flat_marginals(B, T_flat, K, g):
    return torch.randn(B, T_flat * K + K * K + 2 * K, generator=g, dtype=torch.float64)


def test_inner_torch_twin_promotes_mixed_dtypes():
    """float64 marginals against float32 potentials (start and end included): the promoted dtype, as documented."""
    g = torch.Generator().manual_seed(3)
    theta = _potentials(2, 3, 3, g, True)
    z = _flat_marginals(2, 3, 3, g)
    got = chain_inner(*(t.float() for t in theta), z, backend="torch")
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, chain_inner(*(t.float().double() for t in theta), z, backend="torch"))


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba())])
def test_padding_and_empty_batches(backend):
    """-inf potentials read at padded positions count 0, as in every twin (not -inf * 0 = NaN); an empty batch gives
    empty results; the numba inner product computes in the dtype promoted over all its inputs."""
    K, T = 2, 3
    unary = torch.zeros(2, T, K, dtype=torch.float64)
    forbid = torch.tensor([[0.0, 0.0], [-torch.inf, 0.0]], dtype=torch.float64)  # 1 -> 0 forbidden
    labels = torch.tensor([[[0, 1, 1]], [[1, 1, -1]]])  # the pair (1, padding -> 0) is past the length
    lengths = torch.tensor([3, 2])
    assert chain_labels_score(unary, forbid, None, None, labels, lengths, backend=backend).flatten().tolist() == [0, 0]
    unary[1, 2] = -torch.inf
    assert chain_labels_score(unary, forbid.clamp_min(0), None, None, labels, lengths,
                              backend=backend).flatten().tolist() == [0, 0]
    empty = chain_marginals(torch.zeros(0, T, dtype=torch.long), torch.zeros(0, dtype=torch.long), K,
                            torch.zeros(0, T, dtype=torch.long), backend=backend)
    assert empty.shape == (0, T * K + K * K + 2 * K)
    g = torch.Generator().manual_seed(4)
    theta = _potentials(2, 3, 3, g, True)
    th = (theta[0].float(),) + theta[1:]
    z = _flat_marginals(2, 3, 3, g).float()
    got = chain_inner(*th, z, backend=backend)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, chain_inner(*th, z.double(), backend="torch"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("start_end", [True, False])
def test_inner_twin_is_the_explicit_sum(start_end):
    """``<theta_b, z_b>`` over the flat layout, with rows longer than the potentials (the batch's T < the data's)."""
    g = torch.Generator().manual_seed(2)
    B, T, T_flat, K = 5, 4, 7, 3
    theta = _potentials(B, T, K, g, start_end)
    z = _flat_marginals(B, T_flat, K, g)
    got = chain_inner(*theta, z, backend="torch")
    a = T_flat * K
    for b in range(B):
        ref = sum(float(theta[0][b, t, k] * z[b, t * K + k]) for t in range(T) for k in range(K))
        ref += sum(float(theta[1][i, j] * z[b, a + i * K + j]) for i in range(K) for j in range(K))
        if start_end:
            ref += sum(float(theta[2][k] * z[b, a + K * K + k] + theta[3][k] * z[b, a + K * K + K + k])
                       for k in range(K))
        assert float(got[b]) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("minus", [False, True])
def test_marginals_twin_is_the_structures_one_hot_counts(minus):
    g = torch.Generator().manual_seed(1)
    B, T, K = 7, 6, 3
    lengths = _lengths(B, T, g)
    y, y2 = _labellings(B, 2, T, K, lengths, g).unbind(1)
    got = chain_marginals(y, lengths, K, y2 if minus else None, backend="torch")

    def flat(labels):
        m = Chain(K).marginals(labels, lengths, dtype=torch.float64)
        return torch.cat([m.unary.flatten(1), m.transition.flatten(1), m.start, m.end], 1)

    assert torch.equal(got, flat(y) - flat(y2) if minus else flat(y))


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton()),
                                     pytest.param("numba", marks=needs_numba()),
                                     pytest.param("numba-threads", marks=needs_numba())])
@pytest.mark.parametrize("T", [1, 5, 33])
def test_compiled_kernels_match_their_twins(T, backend, monkeypatch):
    """The Triton kernels and the numba twins against the torch twins: scores equal to rounding (float64 and
    float32), counts bitwise (also with the rows on threads, as for a large batch)."""
    if backend == "numba-threads":
        from torchssvm.kernels.chain import chain_marginals_numba

        monkeypatch.setattr(chain_marginals_numba, "_PARALLEL_MIN_WORK", 0)
        backend = "numba"
    g = torch.Generator().manual_seed(T)
    B, C, K = 9, 4, 5
    lengths = _lengths(B, T, g)
    for start_end in (True, False):
        theta = _potentials(B, T, K, g, start_end)
        th32 = [None if t is None else t.float() for t in theta]
        y = _labellings(B, C, T, K, lengths, g, width=T + 3)
        ref = chain_labels_score(*theta, y, lengths, backend="torch")
        for labels in (y, y.int()):
            torch.testing.assert_close(chain_labels_score(*theta, labels, lengths, backend=backend), ref,
                                       rtol=0, atol=1e-12)
        got32 = chain_labels_score(*th32, y, lengths, backend=backend)
        assert got32.dtype == torch.float32
        torch.testing.assert_close(got32, chain_labels_score(*th32, y, lengths, backend="torch"), rtol=1e-5, atol=1e-5)
        for K_in in (K, 40):  # 40: more than one chunk of the unary and transition parts (Triton)
            th = theta if K_in == K else _potentials(B, T, K_in, g, start_end)
            for T_flat in (T, T + 2):  # rows as long as the potentials, and longer
                z = _flat_marginals(B, T_flat, K_in, g)
                torch.testing.assert_close(chain_inner(*th, z, backend=backend), chain_inner(*th, z, backend="torch"),
                                           rtol=1e-12, atol=1e-12)
        z32 = _flat_marginals(B, T, K, g).float()
        got32 = chain_inner(*th32, z32, backend=backend)
        assert got32.dtype == torch.float32
        torch.testing.assert_close(got32, chain_inner(*th32, z32, backend="torch"), rtol=1e-5, atol=1e-5)
    y, y2 = _labellings(B, 2, T, K, lengths, g).unbind(1)
    z = _flat_marginals(B, T, K, g)
    z[:, ::3] = 0.0  # with exact zeros, where the count is zero and where it is not
    for minus in (None, y2):  # counts: the same floats in any order of the adds
        for dtype in (torch.float64, torch.float32):
            ref = chain_marginals(y, lengths, K, minus, dtype, backend="torch")
            assert torch.equal(chain_marginals(y, lengths, K, minus, dtype, backend=backend), ref)
            # the FW direction m(y) - m(y') - z in one pass: the same floats as the subtraction after the counts
            zd = z.to(dtype)
            assert torch.equal(chain_marginals(y, lengths, K, minus, dtype, backend=backend, subtract=zd), ref - zd)


@needs_triton()
def test_bcfw_on_the_triton_kernels_follows_the_torch_twins():
    """The chain problem's scores, corners and oracle on Triton: the same pairwise + cache run as on torch, up to
    the rounding of the scores' sums."""
    ds = ts.data.synthetic_chain("train", 48, num_labels=4, num_features=6, seed=0)
    runs = {}
    for backend in ("torch", "triton"):
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
        s = ts.optim.BCFW(model, ds, lam=0.05, batch_size=16, step="pairwise", sampling="gap", cache_size=4,
                          gap_check_every=2, seed=0, backend=backend)
        runs[backend] = [s.step() for _ in range(4)], s.w
    (r_torch, w_torch), (r_triton, w_triton) = runs["torch"], runs["triton"]
    assert r_torch[-1]["cache_hits"] > 0
    torch.testing.assert_close(w_triton, w_torch, rtol=1e-9, atol=1e-9)
    for a, b in zip(r_torch, r_triton):
        assert a["gap"] == pytest.approx(b["gap"], rel=1e-8, abs=1e-12)


# -- the compiled CPU twins (numba) ------------------------------------------------------------------------------


@needs_numba()
def test_numba_kernels_check_what_their_loops_do_not():
    from torchssvm.kernels.chain.chain_marginals_numba import chain_marginals_numba
    from torchssvm.kernels.chain.chain_score_numba import chain_inner_numba, chain_labels_score_numba

    g = torch.Generator().manual_seed(0)
    B, T, K = 3, 4, 5
    theta = _potentials(B, T, K, g)
    lengths = torch.tensor([4, 2, 1])
    y = _labellings(B, 2, T, K, lengths, g)
    bad = y.clone()
    bad[1, 0, 1] = K  # inside the length
    with pytest.raises(ValueError, match="labels must be < num_labels"):
        chain_labels_score_numba(*theta, bad, lengths)
    with pytest.raises(ValueError, match="labels must be < num_labels"):
        chain_marginals_numba(bad[:, 0], lengths, K)
    ignored = y.clone()
    ignored[1, 0, 3] = K + 7  # past the length the compiled loop reads nothing (the torch twin gathers, so < K)
    torch.testing.assert_close(chain_labels_score_numba(*theta, ignored, lengths),
                               chain_labels_score(*theta, y, lengths, backend="torch"), rtol=0, atol=1e-12)
    for ln in (torch.tensor([5, 1, 1]), torch.tensor([0, 1, 1]), torch.tensor([1, 1])):
        with pytest.raises(ValueError, match="lengths"):
            chain_labels_score_numba(*theta, y, ln)
        with pytest.raises(ValueError, match="lengths"):
            chain_marginals_numba(y[:, 0], ln, K)
    with pytest.raises(ValueError, match="transition"):
        chain_labels_score_numba(theta[0], torch.zeros(B, T - 1, K, K), None, None, y, lengths)
    with pytest.raises(ValueError, match="z must have shape"):
        chain_inner_numba(*theta, torch.zeros(B, (T - 1) * K + K * K + 2 * K, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32 or float64"):
        chain_marginals_numba(y[:, 0], lengths, K, dtype=torch.float16)
    # "auto" on CPU runs them for float32 / float64 and keeps torch for half types
    half = [t.to(torch.bfloat16) for t in theta]
    torch.testing.assert_close(chain_labels_score(*half, y, lengths), chain_labels_score(*half, y, lengths,
                                                                                         backend="torch"))


@needs_numba()
def test_bcfw_on_the_numba_kernels_follows_the_torch_twins():
    """The chain problem on the numba twins (what "auto" runs on CPU). FW steps with gap sampling and a cache: the
    same run as on torch, up to the rounding of the scores' sums. Pairwise steps leave a block's two active atoms
    scoring equally up to rounding (the exact line search zeroes their directional derivative), so when the block is
    drawn again the twins may take different, equally valid away atoms and their runs part (numba 0.68's rounding
    did at the fourth pass): there both must certify the same optimum, as CPU and CUDA do in test_gpu."""
    ds = ts.data.synthetic_chain("train", 48, num_labels=4, num_features=6, seed=0)

    def solver(backend, **kw):
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
        return ts.optim.BCFW(model, ds, batch_size=16, sampling="gap", cache_size=4, gap_check_every=2, seed=0,
                             backend=backend, **kw)

    runs = {}
    for backend in ("torch", "numba", "auto"):
        s = solver(backend, lam=0.05, step="fw")
        runs[backend] = [s.step() for _ in range(6)], s.w
    (r_torch, w_torch), (r_numba, w_numba), (_, w_auto) = runs["torch"], runs["numba"], runs["auto"]
    assert r_torch[-1]["cache_hits"] > 0
    assert torch.equal(w_auto, w_numba)
    torch.testing.assert_close(w_numba, w_torch, rtol=1e-9, atol=1e-9)
    for a, b in zip(r_torch, r_numba):
        assert a["gap"] == pytest.approx(b["gap"], rel=1e-8, abs=1e-12)
        assert a["cache_hits"] == b["cache_hits"]

    certs = []
    for backend in ("torch", "numba"):
        s = solver(backend, lam=2.0, step="pairwise")
        history = s.fit(max_passes=150, gap_tol=0.01)
        assert history[-1]["cache_hits"] > 0
        cert = s.duality_gap()
        assert abs(cert["primal"] - cert["dual"] - cert["gap"]) <= 1e-12 and cert["gap"] <= 0.01
        certs.append(cert)
    # P* <= P <= P* + gap on each, so the two primal values differ by at most the larger certified gap
    assert abs(certs[0]["primal"] - certs[1]["primal"]) <= max(certs[0]["gap"], certs[1]["gap"]) + 1e-12


@needs_numba()
def test_numba_kernels_on_odd_labels_and_what_auto_runs(monkeypatch):
    """Negative labels inside a length (clamped to 0 by both twins' scores, skipped by both twins' counts), labels
    past a length (counted by the marginals' unary part in both twins), K = 0; and that "auto" runs the numba twins
    on CPU for float64 and keeps torch for mixed dtypes and per-position transitions."""
    import importlib

    from torchssvm.kernels.chain.chain_marginals_numba import chain_marginals_numba
    from torchssvm.kernels.chain.chain_score_numba import chain_labels_score_numba

    g = torch.Generator().manual_seed(3)
    B, T, K = 4, 5, 3
    theta = _potentials(B, T, K, g)
    lengths = torch.tensor([5, 3, 2, 1])
    y = _labellings(B, 2, T, K, lengths, g)
    y[0, 0, 2], y[1, 1, 0], y[0, 1, 4] = -1, -2, -5  # inside the lengths
    y[2, 0, 3] = 1  # past the length
    torch.testing.assert_close(chain_labels_score(*theta, y, lengths, backend="numba"),
                               chain_labels_score(*theta, y, lengths, backend="torch"), rtol=0, atol=1e-12)
    for minus in (None, y[:, 1]):
        assert torch.equal(chain_marginals(y[:, 0], lengths, K, minus, backend="numba"),
                           chain_marginals(y[:, 0], lengths, K, minus, backend="torch"))
    with pytest.raises(ValueError, match="minus"):
        chain_marginals_numba(y[:, 0], lengths, K, y[:, 1, :T - 1])
    for bad in (torch.zeros(B, T * K, dtype=torch.float64), torch.zeros(B, T * K + K * K + 2 * K)):  # float32
        with pytest.raises(ValueError, match="subtract must be"):
            chain_marginals_numba(y[:, 0], lengths, K, subtract=bad)
    with pytest.raises(ValueError, match="subtract must be of dtype"):
        chain_marginals(y[:, 0], lengths, K, subtract=torch.zeros(B, T * K + K * K + 2 * K), backend="torch")
    with pytest.raises(ValueError, match="num_labels"):
        chain_marginals_numba(torch.full((1, 2), -1), torch.tensor([2]), 0)
    with pytest.raises(ValueError, match="K >= 1"):
        chain_labels_score_numba(torch.zeros(1, 2, 0), torch.zeros(0, 0), None, None, torch.zeros(1, 1, 2).long(),
                                 torch.tensor([2]))
    with pytest.raises(ValueError, match="one dtype"):
        chain_labels_score_numba(theta[0].float(), *theta[1:], y, lengths)

    calls = []
    for module, name in (("chain_score_numba", "chain_labels_score_numba"), ("chain_score_numba", "chain_inner_numba"),
                         ("chain_marginals_numba", "chain_marginals_numba")):
        mod = importlib.import_module(f"torchssvm.kernels.chain.{module}")
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    z = _flat_marginals(B, T, K, g)
    chain_labels_score(*theta, y, lengths)
    chain_inner(*theta, z)
    chain_marginals(y[:, 0], lengths, K)
    assert calls == ["chain_labels_score_numba", "chain_inner_numba", "chain_marginals_numba"]
    # mixed dtypes (a half type among them too) are promoted to float64 first: the compiled twins then compute what
    # torch does
    chain_labels_score(theta[0].float(), *theta[1:], y, lengths)
    chain_inner(theta[0].bfloat16(), *theta[1:], z)
    assert calls[3:] == ["chain_labels_score_numba", "chain_inner_numba"]
    chain_labels_score(*(t.bfloat16() for t in theta), y, lengths)  # one half type: torch
    per_position = torch.randn(B, T - 1, K, K, generator=g, dtype=torch.float64)
    chain_labels_score(theta[0], per_position, *theta[2:], y[:, :1], lengths)  # per-position transitions: torch
    assert len(calls) == 5


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton()), "torch",
                                     pytest.param("numba", marks=needs_numba())])
def test_chain_kernels_check_their_arguments_on_every_backend(backend):
    """The Triton kernels read what the shapes say: a length past T segfaulted, labels narrower than T or a z without
    its unary block read other rows; torch counted a label >= K into the next position's block."""
    u, tr = torch.randn(2, 3, 2, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)
    y = torch.tensor([[0, 1, 0]])
    cases = [
        (lambda: chain_marginals(y, torch.tensor([5]), 2, backend=backend), r"lengths must .*\[1, 3\]"),
        (lambda: chain_marginals(y, torch.tensor([0]), 2, backend=backend), r"lengths must .*\[1, 3\]"),
        (lambda: chain_marginals(torch.tensor([[2, 0, -1]]), torch.tensor([2]), 2, backend=backend),
         "labels must be <"),
        (lambda: chain_marginals(torch.tensor([[1, 0, 7]]), torch.tensor([2]), 2, backend=backend),
         "labels must be <"),  # torch counted the 7 past the length in another position's block
        (lambda: chain_marginals(y, torch.tensor([3]), 2, minus=torch.zeros(1, 2, dtype=torch.long),
                                 backend=backend), "minus must have the shape of labels"),
        (lambda: chain_labels_score(u, tr, None, None, torch.zeros(2, 1, 2, dtype=torch.long), torch.tensor([3, 3]),
                                    backend=backend), r"labels must have shape \(2, C, >= 3\)"),
        (lambda: chain_labels_score(u, tr, None, None, torch.full((2, 1, 3), 2), torch.tensor([3, 3]),
                                    backend=backend), "labels must be < (num_labels = )?2"),
        (lambda: chain_labels_score(u, tr, None, None, torch.zeros(2, 1, 3, dtype=torch.long), torch.tensor([3]),
                                    backend=backend), r"lengths must"),
        (lambda: chain_inner(u, tr, None, None, torch.randn(2, 8, dtype=torch.float64), backend=backend),
         "z must have shape"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    m = chain_marginals(torch.tensor([[1, 0, -1]]), torch.tensor([2]), 2, backend=backend)
    torch.testing.assert_close(m.sum(1), torch.tensor([2.0 + 1 + 2], dtype=m.dtype))  # 2 unary, 1 transition, 2 ends


def test_torch_viterbi_decodes_bfloat16_batches():
    """The torch twin (what "auto" keeps for half types) backtracked in numpy from B = 16 on: numpy has no
    bfloat16."""
    from torchssvm.kernels import viterbi

    g = torch.Generator().manual_seed(0)
    u, tr = torch.randn(20, 4, 3, generator=g), torch.randn(3, 3, generator=g)
    lengths = torch.randint(1, 5, (20,), generator=g)
    labels, score = viterbi(u.bfloat16(), tr.bfloat16(), None, None, lengths)
    ref, ref_score = viterbi(u.bfloat16().float(), tr.bfloat16().float(), None, None, lengths, backend="torch")
    assert torch.equal(labels, ref)
    torch.testing.assert_close(score.float(), ref_score, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=needs_triton()), "torch",
                                     pytest.param("numba", marks=needs_numba()), "auto"])
def test_chain_scores_of_mixed_dtypes_are_promoted_on_every_backend(backend):
    """float32 potentials with a float64 transition / start / z: torch returned float64 for the scores and float32
    for the inner products, Triton float32 for both (rounded differently), numba refused."""
    g = torch.Generator().manual_seed(0)
    B, T, K = 3, 4, 3
    u, tr = torch.randn(B, T, K, generator=g), torch.randn(K, K, generator=g, dtype=torch.float64)
    start, end = torch.randn(K, generator=g, dtype=torch.float64), torch.randn(K, generator=g)
    lengths = torch.tensor([4, 2, 1])
    y = torch.randint(0, K, (B, 2, T), generator=g)
    z = torch.rand(B, T * K + K * K + 2 * K, generator=g)
    ref_s = chain_labels_score(u.double(), tr, start, end.double(), y, lengths, backend="torch")
    ref_i = chain_inner(u.double(), tr, start, end.double(), z.double(), backend="torch")
    s = chain_labels_score(u, tr, start, end, y, lengths, backend=backend)
    i = chain_inner(u, tr, start, end, z, backend=backend)
    assert s.dtype == i.dtype == torch.float64
    torch.testing.assert_close(s, ref_s, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(i, ref_i, rtol=1e-12, atol=1e-12)
