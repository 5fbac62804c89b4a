"""Viterbi: the torch twin, the Triton kernel and the numba twin against brute-force enumeration and each other."""

import importlib

import pytest
import torch
from conftest import brute_force_chain, needs_numba, needs_triton
from hypothesis import given, settings
from hypothesis import strategies as st
from torchssvm.kernels import resolve_backend, viterbi_torch

import torchssvm as ts
from torchssvm.structures.chain import ChainPotentials


def random_chain(B, T, K, *, per_position, integer, start=True, end=True, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        if integer:  # small integers: many exact ties
            return torch.randint(-2, 3, shape, generator=g).to(dtype)
        return torch.randn(*shape, generator=g, dtype=dtype)

    unary = draw(B, T, K)
    trans = draw(B, T - 1, K, K) if per_position else draw(K, K)
    s = draw(K) if start else None
    e = draw(K) if end else None
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return unary, trans, s, e, lengths


def check_against_brute_force(labels, scores, unary, trans, s, e, lengths):
    for b in range(unary.shape[0]):
        L = int(lengths[b])
        tr = trans[b] if trans.dim() == 4 else trans
        y_bf, v_bf = brute_force_chain(unary[b], tr, s, e, L)
        assert labels[b, :L].tolist() == y_bf
        assert (labels[b, L:] == -1).all()
        assert float(scores[b]) == pytest.approx(v_bf, abs=1e-9)


@pytest.fixture(params=["batch_first", "batch_last"])
def layout(request, monkeypatch):
    """Run a test under both memory layouts of the torch twin."""
    vt = importlib.import_module("torchssvm.kernels.chain.viterbi_torch")
    monkeypatch.setattr(vt, "_BATCH_LAST_MIN_B", 1 if request.param == "batch_last" else 10**9)
    return request.param


@pytest.mark.parametrize("K", [2, 3, 4, 5])
@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("integer", [True, False])
def test_torch_viterbi_matches_brute_force(K, per_position, integer, layout):
    for seed in range(3):
        unary, trans, s, e, _ = random_chain(7, 6, K, per_position=per_position, integer=integer,
                                             seed=seed + 10 * K, start=seed != 1, end=seed != 2)
        args = (unary, trans, s, e, torch.tensor([6, 5, 4, 3, 2, 1, 6]))  # every length 1..6
        labels, scores = viterbi_torch(*args)
        check_against_brute_force(labels, scores, *args)


def test_every_length_one_to_six(layout):
    unary, trans, s, e, _ = random_chain(6, 6, 3, per_position=False, integer=True, seed=5)
    lengths = torch.arange(1, 7)
    labels, scores = viterbi_torch(unary, trans, s, e, lengths)
    check_against_brute_force(labels, scores, unary, trans, s, e, lengths)


def test_ties_break_to_smallest_reversed_labelling(layout):
    # all-zero potentials: every labelling ties; the rule picks all zeros
    z = torch.zeros(2, 4, 3, dtype=torch.float64)
    labels, _ = viterbi_torch(z, torch.zeros(3, 3, dtype=torch.float64), None, None, torch.tensor([4, 2]))
    assert labels.tolist() == [[0, 0, 0, 0], [0, 0, -1, -1]]


@needs_triton()
@pytest.mark.parametrize("K", [2, 3, 4, 5])
@pytest.mark.parametrize("per_position", [False, True])
def test_triton_matches_brute_force(K, per_position):
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    unary, trans, s, e, _ = random_chain(6, 6, K, per_position=per_position, integer=True, seed=K)
    args = (unary, trans, s, e, torch.tensor([6, 5, 4, 3, 2, 1]))
    labels, scores = viterbi_triton(*args)
    check_against_brute_force(labels, scores, *args)


@needs_triton()
@pytest.mark.parametrize(
    "B,T,K,per_position,integer,dtype",
    [
        (6, 7, 26, False, True, torch.float32),
        (4, 9, 45, True, False, torch.float32),
        (3, 5, 64, False, True, torch.float64),
        (3, 6, 65, False, True, torch.float32),  # first tiled size
        (2, 5, 130, True, True, torch.float32),
        (2, 4, 300, False, False, torch.float64),
        (1, 3, 1024, False, True, torch.float32),
        (20, 6, 45, True, True, torch.float32),
    ],
)
def test_triton_equals_torch_bitwise(B, T, K, per_position, integer, dtype, layout):
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    args = random_chain(B, T, K, per_position=per_position, integer=integer, seed=K, dtype=dtype)
    a = viterbi_torch(*args)
    b = viterbi_triton(*args)
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1], b[1])


@needs_triton()
@pytest.mark.parametrize("K", [5, 70])  # single tile and tiled
@pytest.mark.parametrize("per_position", [False, True])
def test_triton_without_start_end(K, per_position):
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    args = random_chain(4, 6, K, per_position=per_position, integer=True, start=False, end=False, seed=3)
    a, b = viterbi_torch(*args), viterbi_triton(*args)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_triton()
@pytest.mark.parametrize("K", [5, 70])
@pytest.mark.parametrize("per_position", [False, True])
def test_triton_single_position(K, per_position):
    """T = 1: no transitions at all (a per-position tensor of shape (B, 0, K, K))."""
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    args = random_chain(3, 1, K, per_position=per_position, integer=False, seed=4)
    a, b = viterbi_torch(*args), viterbi_triton(*args)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    expect = (args[0][:, 0] + args[2] + args[3]).argmax(1)
    assert a[0][:, 0].tolist() == expect.tolist()


# -- the Triton kernels by name: one program per sequence, the GPU-wide max-plus product (persistent and one launch
# per step), the legacy kernel ------------------------------------------------------------------------------------

TRITON_KERNELS = ["sequence", "grid", "grid-steps", "legacy"]


@needs_triton()
@pytest.mark.parametrize("kernel", TRITON_KERNELS)
@pytest.mark.parametrize(
    "B,T,K,per_position,integer,dtype,start_end",
    [
        (4, 5, 1, False, True, torch.float32, True),  # K = 1: one labelling
        (5, 7, 3, True, True, torch.float64, True),
        (6, 6, 45, False, True, torch.float32, True),  # not a power of two; many ties
        (4, 6, 37, True, False, torch.float32, False),
        (3, 5, 64, False, True, torch.float64, True),  # the sequence kernel's largest tile
        (3, 6, 70, False, True, torch.float32, True),  # past it: more labels than a grid tile
        (2, 5, 130, True, True, torch.float32, True),
        (3, 4, 300, False, False, torch.float64, False),
    ],
)
def test_triton_kernels_equal_torch_bitwise(kernel, B, T, K, per_position, integer, dtype, start_end):
    """Every kernel, forced by name, equals the torch twin bitwise: ragged lengths (1 to T), integer potentials
    (ties everywhere), per-position transitions, no start/end scores."""
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    if kernel == "sequence" and K > 64:
        pytest.skip("the sequence kernel is for K <= 64 (auto runs the grid kernel above)")
    args = random_chain(B, T, K, per_position=per_position, integer=integer, seed=K + B, dtype=dtype,
                        start=start_end, end=start_end)
    a = viterbi_torch(*args)
    b = viterbi_triton(*args, kernel=kernel)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_triton()
@pytest.mark.parametrize("kernel", TRITON_KERNELS)
@pytest.mark.parametrize(
    "B,T,K,per_position,dtype,start_end",
    [
        (5, 7, 3, True, torch.float64, True),
        (6, 6, 45, False, torch.float32, True),
        (4, 6, 37, True, torch.float32, False),
        (3, 6, 70, False, torch.float32, True),
        (2, 5, 130, True, torch.float64, True),
    ],
)
def test_triton_kernels_guard_and_hinge_options(kernel, B, T, K, per_position, dtype, start_end):
    """The overflow guard's and the fused hinge's options (`viterbi_triton`'s ``guard``, ``scale_unary`` and
    ``gold``), every kernel, with partial maxima that make the guard's ``s`` 0 and 3: decoding equals decoding the
    potentials times ``2**-s`` bitwise, the value scaled back by ``2**s`` (integer potentials: ties everywhere, so a
    factor applied to one term and not another would change labels); ``scale_unary=False`` takes the unary as
    scaled already; with ``gold`` the value is ``max(score - gold, 0) 2**s``, NaN kept."""
    import math

    from torchssvm.kernels.chain.guard_triton import ChainGuard
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    if kernel == "sequence" and K > 64:
        pytest.skip("the sequence kernel is for K <= 64")
    unary, trans, st, en, lengths = random_chain(B, T, K, per_position=per_position, integer=True, seed=K, dtype=dtype,
                                                 start=start_end, end=start_end)
    log2_max = math.log2(torch.finfo(dtype).max)
    for s in (0, 3):
        # the largest magnitude M that makes the guard take s: log2 M + log2(4 (3T + 1)) - log2(max) in [s - 1, s)
        M = 1.0 if s == 0 else 2.0 ** (log2_max + s - 0.5 - math.log2(4 * (3 * T + 1)))
        guard = ChainGuard(torch.tensor([M, 0.0, 0.0, 0.0], dtype=torch.float64), 1, T)
        sc, inv = 2.0 ** -s, 2.0 ** s
        scaled = [None if t is None else t * sc for t in (unary, trans, st, en)]
        ref_labels, ref_score = viterbi_torch(*scaled, lengths)
        for scale_unary in (True, False):
            u = unary if scale_unary else scaled[0]
            labels, score = viterbi_triton(u, trans, st, en, lengths, kernel=kernel, guard=guard,
                                           scale_unary=scale_unary)
            assert torch.equal(labels, ref_labels) and torch.equal(score, ref_score * inv), (s, scale_unary)
        gold = ref_score - torch.arange(B, dtype=dtype) + 1.0  # hinges 1, 0, 0 (clamped), ...
        gold[-1] = float("nan")
        labels, hinge = viterbi_triton(scaled[0], trans, st, en, lengths, kernel=kernel, guard=guard,
                                       scale_unary=False, gold=gold)
        assert torch.equal(labels, ref_labels)
        want = (ref_score - gold).clamp_min(0) * inv
        assert torch.equal(hinge[:-1], want[:-1]) and bool(hinge[-1].isnan()), (hinge, want)


@needs_triton()
@pytest.mark.parametrize("K,tiles", [(13, dict(BB=2, BJ=4, BI=8)), (21, dict(BB=1, BJ=8, BI=16)),
                                     (37, dict(BB=4, BJ=16, BI=32))])
@pytest.mark.parametrize("per_position", [False, True])
def test_grid_tiling_smaller_than_the_problem(K, tiles, per_position):
    """The grid kernel's tiling where every block is smaller than the problem: several batch blocks (the last one
    partial), several output blocks and reduction chunks, the last of each partial (K a multiple of neither ``BJ``
    nor ``BI``, and at most 2 ``BI`` and 5 ``BJ``: the interpreter's time grows as K^2), run as many programs (one
    launch per step) and as one persistent program walking every item."""
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    assert K % tiles["BJ"] and K % tiles["BI"] and 1 < -(-K // tiles["BI"]) <= 2 and 2 < -(-K // tiles["BJ"]) <= 5
    args = random_chain(7, 6, K, per_position=per_position, integer=True, seed=11)
    args[4][:] = torch.tensor([6, 1, 3, 6, 2, 5, 4])  # ragged, a length-1 sequence inside a block
    ref = viterbi_torch(*args)
    for kernel, programs in (("grid-steps", None), ("grid-steps", 3), ("grid", 1)):
        got = viterbi_triton(*args, kernel=kernel, tiles=tiles, programs=programs)
        assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1]), (kernel, programs)


@needs_triton()
@pytest.mark.parametrize("kernel", TRITON_KERNELS)
@pytest.mark.parametrize("K", [4, 100])
def test_triton_kernels_break_ties_to_the_smallest_reversed_labelling(kernel, K):
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    if kernel == "sequence" and K > 64:
        pytest.skip("K <= 64")
    z = torch.zeros(3, 5, K, dtype=torch.float32)
    labels, score = viterbi_triton(z, torch.zeros(K, K), None, None, torch.tensor([5, 2, 1]), kernel=kernel)
    assert labels.tolist() == [[0] * 5, [0, 0, -1, -1, -1], [0, -1, -1, -1, -1]]
    assert score.tolist() == [0.0, 0.0, 0.0]


@needs_triton()
def test_triton_kernel_choice_and_arguments():
    from torchssvm.kernels.chain.viterbi_triton import SEQUENCE_MAX_K, choose_kernel, grid_tiles, viterbi_triton

    cpu = torch.device("cpu")
    assert choose_kernel(512, 100, 45, cpu) == "sequence" and choose_kernel(8, 50, SEQUENCE_MAX_K, cpu) == "sequence"
    assert choose_kernel(8, 50, 1024, cpu) == "grid"  # the interpreter runs the persistent kernel with one program
    assert choose_kernel(2, 3, 5000, cpu) == "legacy"  # past the grid kernel's whole-row backtrack
    t = grid_tiles(8, 1024, 132)
    assert (t["BB"], t["BJ"], t["BI"]) == (8, 8, 128) and t["BK"] >= 1024
    args = random_chain(2, 3, 5, per_position=False, integer=True)
    with pytest.raises(ValueError, match="kernel must be one of"):
        viterbi_triton(*args, kernel="fast")
    with pytest.raises(ValueError, match="K <= 128"):
        viterbi_triton(*random_chain(1, 2, 130, per_position=False, integer=True), kernel="sequence")
    with pytest.raises(ValueError, match="one program under the interpreter"):
        viterbi_triton(*args, kernel="grid", programs=2)
    labels, score = viterbi_triton(args[0][:0], *args[1:4], args[4][:0])  # an empty batch
    assert labels.shape == (0, 3) and score.shape == (0,)


def test_large_batch_is_chunked_consistently(monkeypatch):
    vt = importlib.import_module("torchssvm.kernels.chain.viterbi_torch")

    args = random_chain(9, 5, 4, per_position=True, integer=True, seed=1)
    full = vt.viterbi_torch(*args)
    monkeypatch.setattr(vt, "_MAX_STEP_ELEMENTS", 40)  # forces chunks of 2 sequences
    chunked = vt.viterbi_torch(*args)
    assert torch.equal(full[0], chunked[0]) and torch.equal(full[1], chunked[1])


def test_backend_names(monkeypatch):
    assert resolve_backend("torch", torch.device("cpu")) == "torch"
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("cuda", torch.device("cpu"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.device("cpu"))


@pytest.mark.parametrize("backend", ["torch", "auto", pytest.param("triton", marks=needs_triton())])
@pytest.mark.parametrize("B", [1, 3])
def test_mixed_dtypes_are_promoted(backend, B):
    """Potentials of different float dtypes (a float32 unary, a float64 transition or start): every twin decodes in
    the promoted dtype and returns its score in it, for one sequence and for a batch."""
    from torchssvm.kernels import viterbi

    unary, transition, start, end, lengths = random_chain(B, 4, 3, per_position=False, integer=False, seed=B)
    for u, tr, s0 in [(unary.float(), transition, start), (unary, transition.float(), start.float()),
                      (unary.float(), transition.float(), start)]:
        labels, score = viterbi(u, tr, s0, end.to(u.dtype), lengths, backend=backend)
        ref_labels, ref_score = viterbi_torch(unary, transition, start, end, lengths)
        assert score.dtype == torch.float64 and torch.equal(labels, ref_labels)
        torch.testing.assert_close(score, ref_score, rtol=1e-6, atol=1e-6)


def test_viterbi_ignores_autograd():
    from torchssvm.kernels import viterbi

    unary, trans, s, e, lengths = random_chain(3, 4, 3, per_position=False, integer=False, seed=2)
    labels, score = viterbi(unary.requires_grad_(), trans.requires_grad_(), s, e, lengths, backend="torch")
    assert not score.requires_grad and labels.shape == (3, 4)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 4), T=st.integers(1, 6), K=st.integers(2, 5), per_position=st.booleans(),
    integer=st.booleans(), seed=st.integers(0, 2**31 - 1), batch_last=st.booleans(),
)
def test_property_torch_viterbi_is_exact(B, T, K, per_position, integer, seed, batch_last):
    vt = importlib.import_module("torchssvm.kernels.chain.viterbi_torch")
    old = vt._BATCH_LAST_MIN_B
    vt._BATCH_LAST_MIN_B = 1 if batch_last else 10**9
    try:
        args = random_chain(B, T, K, per_position=per_position, integer=integer, seed=seed)
        labels, scores = viterbi_torch(*args)
    finally:
        vt._BATCH_LAST_MIN_B = old
    check_against_brute_force(labels, scores, *args)


# -- the compiled CPU twin (numba) ------------------------------------------------------------------------------


def _viterbi_numba():
    from torchssvm.kernels.chain.viterbi_numba import viterbi_numba

    return viterbi_numba


@needs_numba()
@pytest.mark.parametrize("K", [2, 3, 4, 5])
@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("integer", [True, False])
def test_numba_viterbi_matches_brute_force(K, per_position, integer):
    for seed in range(3):
        unary, trans, s, e, _ = random_chain(7, 6, K, per_position=per_position, integer=integer,
                                             seed=seed + 10 * K, start=seed != 1, end=seed != 2)
        args = (unary, trans, s, e, torch.tensor([6, 5, 4, 3, 2, 1, 6]))  # every length 1..6
        labels, scores = _viterbi_numba()(*args)
        check_against_brute_force(labels, scores, *args)


@needs_numba()
@pytest.mark.parametrize(
    "B,T,K,per_position,integer,dtype",
    [
        (6, 7, 26, False, True, torch.float32),
        (4, 9, 45, True, False, torch.float32),
        (3, 5, 64, False, True, torch.float64),
        (2, 4, 300, False, False, torch.float64),
        (1, 3, 1024, False, True, torch.float32),
        (20, 6, 45, True, True, torch.float32),
        (1, 1, 7, True, False, torch.float64),  # one position: no transitions, a (1, 0, K, K) per-position tensor
        (64, 14, 26, False, False, torch.float64),  # OCR's shapes, batch-last layout in torch
    ],
)
@pytest.mark.parametrize("parallel", [False, True])
def test_numba_equals_torch_bitwise(B, T, K, per_position, integer, dtype, parallel, monkeypatch):
    vn = importlib.import_module("torchssvm.kernels.chain.viterbi_numba")
    monkeypatch.setattr(vn, "_PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
    for start_end in (True, False):
        args = random_chain(B, T, K, per_position=per_position, integer=integer, seed=K + T, dtype=dtype,
                            start=start_end, end=start_end)
        a, b = viterbi_torch(*args), vn.viterbi_numba(*args)
        assert torch.equal(a[0], b[0])
        assert torch.equal(a[1], b[1]) and b[1].dtype == dtype


@needs_numba()
def test_numba_ties_and_nan_follow_torch():
    vit = _viterbi_numba()
    z = torch.zeros(2, 4, 3, dtype=torch.float64)
    labels, _ = vit(z, torch.zeros(3, 3, dtype=torch.float64), None, None, torch.tensor([4, 2]))
    assert labels.tolist() == [[0, 0, 0, 0], [0, 0, -1, -1]]
    # a NaN wins a maximum and the first NaN an argmax, in torch (each of its layouts) and here alike: a NaN score
    # at a nonzero label of one sequence, and a NaN transition that reaches only the sequences using its labels
    for B in (1, 3, 20):
        for case in ("unary", "transition"):
            unary, trans, s, e, lengths = random_chain(B, 5, 4, per_position=False, integer=False, seed=8 + B)
            if case == "unary":
                unary[0, 2, 3] = float("nan")  # sequence 0 has the full length
            else:
                unary[:, 1:, 2] = -1e9  # label 2 only ever comes first: the NaN transition 2 -> 1 is reached once
                trans[2, 1] = float("nan")
            a, b = viterbi_torch(unary, trans, s, e, lengths), vit(unary, trans, s, e, lengths)
            assert torch.equal(a[0], b[0]), (B, case)
            nan = a[1].isnan()
            assert nan.any() and torch.equal(nan, b[1].isnan()) and torch.equal(a[1][~nan], b[1][~nan]), (B, case)


@needs_numba()
def test_numba_viterbi_is_what_auto_runs_on_cpu(monkeypatch):
    from torchssvm.kernels import _numba, viterbi

    vn = importlib.import_module("torchssvm.kernels.chain.viterbi_numba")
    with pytest.raises(ValueError, match="float32 or float64"):
        vn.viterbi_numba(torch.zeros(1, 2, 3, dtype=torch.bfloat16), torch.zeros(3, 3), None, None,
                         torch.tensor([2]))
    for bad in ([0], [3], [1, 1]):  # out of [1, T], or not one per sequence: the compiled loop does not check
        with pytest.raises(ValueError, match="lengths"):
            vn.viterbi_numba(torch.zeros(1, 2, 3), torch.zeros(3, 3), None, None, torch.tensor(bad))
    for trans, start in ((torch.zeros(3, 4), None), (torch.zeros(1, 2, 3, 3), None), (torch.zeros(3, 3),
                                                                                       torch.zeros(2))):
        with pytest.raises(ValueError, match="transition|start"):
            vn.viterbi_numba(torch.zeros(1, 2, 3), trans, start, None, torch.tensor([2]))
    calls = []
    monkeypatch.setattr(vn, "viterbi_numba", lambda *a: calls.append(1) or viterbi_torch(*a))
    args = random_chain(2, 3, 3, per_position=False, integer=False)
    viterbi(*args)
    assert calls == [1]
    chain = ts.Chain(3)
    pot = ChainPotentials(*args[:4])
    chain.max_oracle(pot, lengths=args[4], backend="numba")
    assert calls == [1, 1]
    monkeypatch.setattr(_numba, "numba", None)  # as without numba installed: auto keeps torch
    viterbi(*args)
    assert calls == [1, 1]


@needs_numba()
@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 4), T=st.integers(1, 6), K=st.integers(2, 5), per_position=st.booleans(),
    integer=st.booleans(), seed=st.integers(0, 2**31 - 1),
)
def test_property_numba_viterbi_is_exact_and_equals_torch(B, T, K, per_position, integer, seed):
    args = random_chain(B, T, K, per_position=per_position, integer=integer, seed=seed)
    labels, scores = _viterbi_numba()(*args)
    check_against_brute_force(labels, scores, *args)
    a = viterbi_torch(*args)
    assert torch.equal(a[0], labels) and torch.equal(a[1], scores)
