"""Finite potentials at the limits of their dtype (float32 near +-3.4e38, float64 near +-1.8e308, float16 near 65504,
bfloat16 near 3.4e38), for every structure, loss and CPU backend: a correct finite result (against an exact
brute-force reference over every labelling) or a clear OverflowError; never NaN, never a wrong finite value
(`torchssvm.structures.base`, "numerics at the dtype's limits"). Plus the clear errors of bad argument types."""

from __future__ import annotations

import itertools
import math
import os
import zlib

import mpmath
import pytest
import torch
from torchssvm.kernels.backends import numba_available, triton_available

import torchssvm as ts

mpmath.mp.dps = 60  # sums of doubles of any exponent, exact far beyond float64's rounding

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and triton_available()
CHAIN_BACKENDS = ["torch"] + (["numba"] if numba_available() else []) + (["triton"] if INTERPRET else [])
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
PATTERNS = ["positive", "negative", "mixed", "one_big"]


# ----------------------------------------------------------------------------------------------- the structures
def _values(shape, pattern, scale, g):
    """float64 values of ``shape`` in ``pattern``, magnitudes up to ``scale``."""
    u = 0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64)
    if pattern == "positive":
        return scale * u
    if pattern == "negative":
        return -scale * u
    if pattern == "mixed":
        return scale * u * (torch.randint(0, 2, shape, generator=g) * 2 - 1)
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    v.view(-1)[torch.randint(0, v.numel(), (1,), generator=g)] = scale * (1 if torch.rand(1, generator=g) < .5 else -1)
    return v


def _chain(dtype, pattern, scale, g):
    B, T, K = 2, 3, 2
    pot = ts.ChainPotentials(*(_values(s, pattern, scale, g).to(dtype) for s in ((B, T, K), (K, K), (K,), (K,))))
    y = torch.randint(0, K, (B, T), generator=g)
    labellings = torch.tensor(list(itertools.product(range(K), repeat=T)))
    return ts.Chain(K), pot, y, None, labellings


def _multiclass(dtype, pattern, scale, g):
    K = 3
    return ts.Multiclass(K), _values((2, K), pattern, scale, g).to(dtype), torch.randint(0, K, (2,), generator=g), \
        None, torch.arange(K)


def _multilabel(dtype, pattern, scale, g):
    ml = ts.MultiLabel(3)
    pot = ts.MultiLabelPotentials(_values((2, 3), pattern, scale, g).to(dtype),
                                  _values((ml.num_edges,), pattern, scale, g).to(dtype))
    return ml, pot, torch.randint(0, 2, (2, 3), generator=g), None, ml.configurations()


def _hierarchy(dtype, pattern, scale, g):
    h = ts.Hierarchy([-1, 0, 0, -1])
    configs = h.configurations()
    return h, _values((2, 4), pattern, scale, g).to(dtype), configs[torch.tensor([1, 4])], None, configs


def _tree(dtype, pattern, scale, g):
    tree = ts.Tree([-1, 0, 0], 2)
    pot = ts.TreePotentials(_values((2, 3, 2), pattern, scale, g).to(dtype),
                            _values((2, 2, 2), pattern, scale, g).to(dtype))
    return tree, pot, torch.randint(0, 2, (2, 3), generator=g), None, \
        torch.tensor(list(itertools.product(range(2), repeat=3)))


def _weights(shape, pattern, scale, g):
    w = _values(shape, pattern, scale, g)
    w[..., 1::2] = w[..., 1::2].abs()  # convex deformation costs
    return w


def _spatial(dtype, pattern, scale, g):
    st = ts.SpatialTree([-1, 0], 2, 2, loss="hamming")
    pot = ts.SpatialTreePotentials(_values((2, 2, 4), pattern, scale, g).to(dtype),
                                   _weights((1, 4), pattern, scale / 8, g).to(dtype))
    return st, pot, torch.randint(0, 4, (2, 2), generator=g), None, \
        torch.tensor(list(itertools.product(range(4), repeat=2)))


def _mixture(dtype, pattern, scale, g):
    mt = ts.MixtureSpatialTree([-1, 0], 2, 2, 2)
    pot = ts.MixtureTreePotentials(_values((2, 2, 4), pattern, scale, g).to(dtype),
                                   _weights((1, 2, 4), pattern, scale / 8, g).to(dtype), None,
                                   _values((2, 1, 2, 4), pattern, scale, g).to(dtype), None,
                                   _values((1, 2, 2), pattern, scale, g).to(dtype))
    y = torch.cat([torch.randint(0, 4, (2, 2), generator=g), torch.randint(0, 2, (2, 1), generator=g)], 1)
    labellings = torch.tensor([list(p) + [t] for p in itertools.product(range(4), repeat=2) for t in range(2)])
    return mt, pot, y, torch.full((2,), 1.5, dtype=dtype), labellings


STRUCTURES = {"chain": _chain, "multiclass": _multiclass, "multilabel": _multilabel, "hierarchy": _hierarchy,
              "tree": _tree, "spatial_tree": _spatial, "mixture_tree": _mixture}
BACKENDS = {"chain": CHAIN_BACKENDS, "spatial_tree": CHAIN_BACKENDS, "mixture_tree": CHAIN_BACKENDS,
            "tree": ["torch"] + (["triton"] if INTERPRET else [])}


# ------------------------------------------------------------------------------------- the exact reference
def _exact_scores(structure, pot, labellings):
    """``(B, N)`` mpf: the exact score of every labelling for every example, ``<theta_b, marginals(y)>``."""
    tensors = structure.tensors(pot)
    marg = structure.marginals(labellings, dtype=torch.float64)
    marg = (marg,) if isinstance(marg, torch.Tensor) else tuple(marg)
    B, N = tensors[0].shape[0], labellings.shape[0]
    out = [[mpmath.mpf(0)] * N for _ in range(B)]
    for t, m in zip(tensors, marg):
        if t is None or m is None:
            continue
        t64 = t.double()
        for b in range(B):
            tb = t64[b] if t64.dim() == m.dim() else t64  # per example or shared
            for j in range(N):
                nz = m[j].nonzero(as_tuple=True)
                for v, w in zip(tb.expand_as(m[j])[nz].tolist(), m[j][nz].tolist()):
                    out[b][j] += mpmath.mpf(v) * mpmath.mpf(w)
    return out


def _reference(structure, pot, y, lengths, labellings, lw):
    B, N = y.shape[0], labellings.shape[0]
    s = _exact_scores(structure, pot, labellings)
    rep = labellings.unsqueeze(0).expand(B, *labellings.shape).reshape(B * N, *labellings.shape[1:])
    truth = y.unsqueeze(1).expand(B, N, *y.shape[1:]).reshape(B * N, *y.shape[1:])
    scale = None if lengths is None else lengths.repeat_interleave(N)
    delta = structure.task_loss(rep, truth, scale).view(B, N).tolist()
    gold = [mpmath.fsum(s[b][j] for j in range(N) if torch.equal(labellings[j], y[b])) for b in range(B)]
    aug = [[lw * mpmath.mpf(delta[b][j]) + s[b][j] for j in range(N)] for b in range(B)]
    return {
        "scores": s,
        "score": gold,
        "value": [max(a) for a in aug],
        "augmented": aug,
        "hinge": [max(mpmath.mpf(0), max(aug[b]) - gold[b]) for b in range(B)],
        "slack": [max(mpmath.mpf(0), max(mpmath.mpf(delta[b][j]) * (1 + s[b][j] - gold[b]) for j in range(N)))
                  for b in range(B)],
        "crf": [mpmath.log(mpmath.fsum(mpmath.exp(v - max(s[b])) for v in s[b])) + max(s[b]) - gold[b]
                for b in range(B)],
        "log_partition": [mpmath.log(mpmath.fsum(mpmath.exp(v - max(s[b])) for v in s[b])) + max(s[b])
                          for b in range(B)],
    }


def _magnitude(pot) -> float:
    return sum(float(t.double().abs().sum()) for t in pot if t is not None) if not isinstance(pot, torch.Tensor) \
        else float(pot.double().abs().sum())


def _out_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(what, run, ref, dtype, magnitude, saturate=False):
    """``run()`` gives ``ref`` (a list of mpf, one per example) to the output dtype's rounding of sums of
    ``magnitude``, or raises a clear OverflowError: where ``ref`` does not fit the output dtype (``saturate``: the
    oracle's value is then +-inf), or, for float64, where the potentials' sums could pass its range. Returns
    ``"exact"`` or ``"error"``."""
    out = _out_dtype(dtype)
    big = torch.finfo(out).max
    fits = all(abs(r) <= big for r in ref)
    try:
        got = run()
    except OverflowError as e:
        msg = str(e)
        assert not fits or out == torch.float64, f"{what}: {msg}"  # float32 widens to float64: no error if it fits
        assert "float" in msg and ("potentials" in msg or "loss" in msg), msg
        return "error"
    got = got.detach()
    assert got.dtype == out, (what, got.dtype)
    assert not bool(got.isnan().any()), f"{what}: NaN {got} for {ref}"
    tol = 64 * torch.finfo(out).eps * magnitude + 1e-6
    for g, r in zip(got.tolist(), ref):
        if abs(r) > big:
            assert saturate, f"{what}: {g} where the exact {mpmath.nstr(r, 5)} overflows {out}: an OverflowError"
            assert g == (float("inf") if r > 0 else -float("inf")), (what, g, r)
        else:
            assert abs(g - float(r)) <= tol, f"{what}: {g} != {mpmath.nstr(r, 8)} (tolerance {tol:.2e})"
    return "exact"


def _scale(dtype, fraction):
    return fraction * torch.finfo(dtype).max


def _cases():
    """float32: near its max (0.9) and well inside it (0.05: the fast path); float64 near its max; the half
    dtypes (computed in float32) near their max, in two patterns."""
    for name in STRUCTURES:
        for dtype in DTYPES:
            fractions = (0.9, 0.05) if dtype == torch.float32 else (0.9,)
            patterns = PATTERNS if dtype in (torch.float32, torch.float64) else ("positive", "mixed")
            for fraction, pattern in itertools.product(fractions, patterns):
                yield name, dtype, fraction, pattern


CASES = list(_cases())


@pytest.mark.parametrize("name,dtype,fraction,pattern", CASES,
                         ids=[f"{n}-{str(d)[6:]}-{f}-{p}" for n, d, f, p in CASES])
def test_limits(name, dtype, fraction, pattern):
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}-{dtype}-{fraction}-{pattern}".encode()))
    structure, pot, y, lengths, labellings = STRUCTURES[name](dtype, pattern, _scale(dtype, fraction), g)
    ref = _reference(structure, pot, y, lengths, labellings, 1.0)
    mag = _magnitude(pot) + 4
    backends = BACKENDS.get(name, ["torch"])
    outcomes = []
    for backend in backends:
        def hinge(backend=backend):
            return ts.structured_hinge_loss(structure, pot, y, lengths, reduction="none", backend=backend)

        outcomes.append(_check(f"{name} hinge [{backend}]", hinge, ref["hinge"], dtype, mag))

        def value(backend=backend):
            y_hat, v = structure.max_oracle(pot, y, lengths, backend=backend)
            # the labelling is a maximizer of the exact objective
            for b in range(y.shape[0]):
                j = next(j for j in range(labellings.shape[0]) if torch.equal(labellings[j], y_hat[b]))
                assert abs(ref["augmented"][b][j] - ref["value"][b]) <= 64 * torch.finfo(_out_dtype(dtype)).eps * mag
            return v

        outcomes.append(_check(f"{name} max_oracle [{backend}]", value, ref["value"], dtype, mag, saturate=True))
    outcomes.append(_check(f"{name} score", lambda: structure.score(pot, y, lengths), ref["score"], dtype, mag))
    if structure.has_slack_oracle:
        outcomes.append(_check(f"{name} slack", lambda: ts.slack_rescaled_hinge_loss(structure, pot, y, lengths,
                                                                                    reduction="none"),
                               ref["slack"], dtype, mag * 8))
    if structure.has_log_partition:
        outcomes.append(_check(f"{name} crf", lambda: ts.crf_negative_log_likelihood(structure, pot, y, lengths,
                                                                                      reduction="none"),
                               ref["crf"], dtype, mag))
        outcomes.append(_check(f"{name} log_partition", lambda: structure.log_partition(pot, lengths),
                               ref["log_partition"], dtype, mag))
    assert outcomes


def test_moderate_float32_potentials_stay_on_the_fast_path():
    """The guard does not change ordinary calls: far from the limits the loss is computed in float32, bitwise as
    before (no float64 copy)."""
    g = torch.Generator().manual_seed(0)
    chain, pot, y, _, _ = _chain(torch.float32, "mixed", 10.0, g)
    tensors = chain.tensors(pot)
    plan = chain.unchecked.overflow_plan
    assert plan(tensors, {"unary": 10.0, "transition": 10.0}) == (False, 0)
    assert plan(tensors, {"unary": 3e38}) == (True, 0)  # float32 potentials: sums in float64
    t64 = tuple(t.double() for t in tensors)
    assert plan(t64, {"unary": 1.7e308}, homogeneous=True) == (True, 5)  # 4 * 3 * 1.7e308 <= 2**4 * 1.8e308, +1
    with pytest.raises(OverflowError, match="potentials.*overflows float64"):
        plan(t64, {"unary": 1.7e308})
    with pytest.raises(OverflowError, match="loss_weight"):
        plan(t64, {"unary": 1.0}, loss_weight=1e308)
    loss = ts.structured_hinge_loss(chain, pot, y, reduction="none")
    assert loss.dtype == torch.float32


def test_the_finding_hinge_crf_slack_near_1e38():
    """The reported cases: float32 potentials near 1e38 gave [nan, inf, ...] (hinge), [inf, nan, ...] (CRF), inf or
    0.0 (slack): now the exact loss, or an OverflowError naming it where float32 cannot hold it."""
    big = 3e38
    u0 = torch.tensor([big, big, -big, -big])
    # two labels; the best labelling scores big (finite), its partial sums reach 2 big (inf in float32)
    pot = ts.ChainPotentials(torch.stack([u0, 0.5 * u0], 1).expand(2, 4, 2).contiguous(), torch.zeros(2, 2))
    pot64 = ts.ChainPotentials(pot.unary.double(), pot.transition.double())
    y = torch.zeros(2, 4, dtype=torch.long)
    chain = ts.Chain(2)
    for loss in (ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss, ts.crf_negative_log_likelihood):
        got = loss(chain, pot, y, reduction="none")
        ref = loss(chain, pot64, y, reduction="none")
        assert not bool(got.isnan().any()) and bool(got.isfinite().all())
        torch.testing.assert_close(got, ref.float())
    assert float(ts.structured_hinge_loss(chain, pot, y, reduction="none")[0]) == pytest.approx(big)
    y[1] = torch.tensor([1, 1, 0, 0])  # example 1's truth scores -3e38: its loss 6e38 has no float32 value
    for loss in (ts.structured_hinge_loss, ts.crf_negative_log_likelihood):
        with pytest.raises(OverflowError, match="the loss of example 1 is 6.0*e\\+38.*float32.*float64"):
            loss(chain, pot, y, reduction="none")
    assert float(ts.structured_hinge_loss(chain, pot64, y, reduction="none")[1]) == pytest.approx(6e38)
    with pytest.raises(OverflowError, match="the loss of example 1"):  # Delta (1 + s - s*) up to 6e38 and more
        ts.slack_rescaled_hinge_loss(chain, pot, y, reduction="none")


def test_a_device_chain_outside_debug_mode_reads_nothing_and_debug_mode_guards_it():
    """On a (simulated) CUDA device the magnitudes are not read outside debug mode (no host wait); debug mode reads
    them with the finiteness check (the same single read) and guards as on the CPU."""
    from torchssvm.testing import simulated_cuda

    big = 3e38
    u0 = torch.tensor([big, big, -big, -big])
    pot_cpu = ts.ChainPotentials(torch.stack([u0, 0.5 * u0], 1).expand(2, 4, 2).contiguous(), torch.zeros(2, 2))
    y = torch.zeros(2, 4, dtype=torch.long)
    ref = ts.structured_hinge_loss(ts.Chain(2), ts.ChainPotentials(pot_cpu.unary.double(), pot_cpu.transition.double()),
                                   y, reduction="none", backend="torch")
    with simulated_cuda() as mode:
        pot = ts.ChainPotentials(*(t.to("cuda", non_blocking=True) for t in pot_cpu[:2]))
        d_y = y.to("cuda", non_blocking=True)
        syncs = mode.syncs
        unguarded = ts.structured_hinge_loss(ts.Chain(2), pot, d_y, reduction="none", backend="torch")
        assert mode.syncs == syncs, mode.sync_sites
        previous = ts.set_debug(True)
        try:
            got = ts.structured_hinge_loss(ts.Chain(2), pot, d_y, reduction="none", backend="torch")
        finally:
            ts.set_debug(previous)
        got, unguarded = got.cpu(), unguarded.cpu()
    torch.testing.assert_close(got, ref.float())
    print("unguarded device loss:", unguarded)


def _device_brute_force(dtype, fraction, pattern, seed):
    """A small chain at ``fraction`` of ``dtype``'s range (B = 3 examples of lengths 4, 2, 3; T = 4, K = 2) and, per
    example at its own length, the exact reference of every result (`_reference`) and its labellings."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}-{dtype}-{fraction}-{pattern}".encode()))
    B, T, K = 3, 4, 2
    pot = ts.ChainPotentials(*(_values(s, pattern, _scale(dtype, fraction), g).to(dtype)
                               for s in ((B, T, K), (K, K), (K,), (K,))))
    y = torch.randint(0, K, (B, T), generator=g)
    lengths = torch.tensor([4, 2, 3])
    labellings = torch.tensor(list(itertools.product(range(K), repeat=T)))
    refs, tabs = [], []
    for b in range(B):
        L = int(lengths[b])
        one = ts.ChainPotentials(pot.unary[b:b + 1, :L], *pot[1:])
        tabs.append(torch.unique(labellings[:, :L], dim=0))
        refs.append(_reference(ts.Chain(K), one, y[b:b + 1, :L], None, tabs[-1], 1.0))
    return pot, y, lengths, refs, tabs


def _assert_exact_or_inf(what, got, refs, key, dtype, magnitude):
    """``got`` (one value per example) is ``refs[b][key]`` to the output dtype's rounding of sums of ``magnitude``
    where that fits the dtype, else +-inf (the device's honest overflow); never NaN."""
    out = _out_dtype(dtype)
    big = torch.finfo(out).max
    assert got.dtype == out, (what, got.dtype)
    assert not bool(got.isnan().any()), f"{what}: NaN in {got}"
    tol = 64 * torch.finfo(out).eps * magnitude + 1e-6
    for b, g in enumerate(got.tolist()):
        r = refs[b][key][0]
        if abs(r) > big:
            assert g == (float("inf") if r > 0 else -float("inf")), (what, g, mpmath.nstr(r, 5))
        else:
            assert abs(g - float(r)) <= tol, f"{what}: {g} != {mpmath.nstr(r, 8)} (tolerance {tol:.2e})"


DEVICE_CASES = [(d, f, p) for d in (torch.float32, torch.float64, torch.bfloat16) for f in (0.9, 0.05)
                for p in PATTERNS if not (d == torch.bfloat16 and p in ("negative", "one_big"))]


@pytest.mark.skipif(not INTERPRET, reason="needs triton and TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype,fraction,pattern", DEVICE_CASES,
                         ids=[f"{str(d)[6:]}-{f}-{p}" for d, f, p in DEVICE_CASES])
def test_a_device_chain_outside_debug_mode_is_guarded_in_its_kernels(dtype, fraction, pattern):
    """The fused hinge and the loss-augmented oracle on a (simulated) CUDA device, outside debug mode: nothing read
    on the host, and still never NaN or a wrong finite value at the dtype's limits. The Triton kernels bound the sums
    from the magnitudes they reduce and run on the potentials times a power of two (`guard_triton`): the exact loss
    and oracle value (to the compute dtype's rounding of the sums) where they fit, +inf where the loss does not (the
    CPU's OverflowError, which a device cannot raise without a read), +-inf for an oracle value (as on the CPU), and
    a maximizing labelling. Against the exact brute force over every labelling."""
    from torchssvm.testing import simulated_cuda

    pot, y, lengths, refs, tabs = _device_brute_force(dtype, fraction, pattern, "device")
    chain = ts.Chain(2)
    with simulated_cuda() as mode:
        d_pot = ts.ChainPotentials(*(t.to("cuda", non_blocking=True) for t in pot))
        d_y, d_len = y.to("cuda", non_blocking=True), lengths.to("cuda", non_blocking=True)
        syncs = mode.syncs
        got = ts.structured_hinge_loss(chain, d_pot, d_y, d_len, reduction="none", backend="auto")
        y_hat, value = chain.max_oracle(d_pot, d_y, d_len)
        assert mode.syncs == syncs, mode.sync_sites
        got, y_hat, value = got.cpu(), y_hat.cpu(), value.cpu()
    out = _out_dtype(dtype)
    big = torch.finfo(out).max
    assert got.dtype == out and value.dtype == out
    assert not bool(got.isnan().any()) and not bool(value.isnan().any()), (got, value)
    tol = 64 * torch.finfo(out).eps * (_magnitude(pot) + 4) + 1e-6
    for b, (gv, vv) in enumerate(zip(got.tolist(), value.tolist())):
        r, v = refs[b]["hinge"][0], refs[b]["value"][0]
        if abs(r) > big:
            assert gv == float("inf"), (gv, r)
        else:
            assert abs(gv - float(r)) <= tol, f"hinge {gv} != {mpmath.nstr(r, 8)} (tolerance {tol:.2e})"
        if abs(v) > big:
            assert vv == (float("inf") if v > 0 else -float("inf")), (vv, v)
        else:
            assert abs(vv - float(v)) <= tol, f"value {vv} != {mpmath.nstr(v, 8)} (tolerance {tol:.2e})"
        L = int(lengths[b])
        j = next(j for j in range(tabs[b].shape[0]) if torch.equal(tabs[b][j], y_hat[b, :L]))
        assert abs(refs[b]["augmented"][0][j] - v) <= tol  # the labelling maximizes the exact objective


@pytest.mark.parametrize("dtype,fraction,pattern", DEVICE_CASES,
                         ids=[f"{str(d)[6:]}-{f}-{p}" for d, f, p in DEVICE_CASES])
def test_a_device_chain_outside_debug_mode_guards_its_torch_paths(dtype, fraction, pattern):
    """A `Chain`'s `score`, `log_partition`, CRF loss, slack-rescaled loss (torch and Triton backends), and its hinge
    and `max_oracle` on the torch backend, on a (simulated) CUDA device outside debug mode: the power of two of
    `device_scaling`, found on the device with no host wait, keeps every sum in range. The exact result (to the
    compute dtype's rounding of the sums) where it fits, +-inf where not, never NaN, a maximizing labelling, and the
    CRF's gradient (the marginals minus the truth's one-hot) that of the CPU's guarded float64 path. Against the
    exact brute force over every labelling."""
    from torchssvm.testing import simulated_cuda

    pot, y, lengths, refs, tabs = _device_brute_force(dtype, fraction, pattern, "torch-paths")
    chain = ts.Chain(2)
    mag = _magnitude(pot) + 4
    leaves = [t.clone().requires_grad_() for t in pot]
    with simulated_cuda() as mode:
        d_pot = ts.ChainPotentials(*(t.to("cuda", non_blocking=True) for t in leaves))
        d_y, d_len = y.to("cuda", non_blocking=True), lengths.to("cuda", non_blocking=True)
        syncs = mode.syncs
        score = chain.score(d_pot, d_y, d_len)
        log_z = chain.log_partition(d_pot, d_len)
        crf = ts.crf_negative_log_likelihood(chain, d_pot, d_y, d_len, reduction="none")
        hinge = ts.structured_hinge_loss(chain, d_pot, d_y, d_len, reduction="none", backend="torch")
        y_hat, value = chain.max_oracle(d_pot, d_y, d_len, backend="torch")
        decoded, top = chain.max_oracle(d_pot, lengths=d_len, backend="torch")
        slack = {be: ts.slack_rescaled_hinge_loss(chain, d_pot, d_y, d_len, reduction="none", backend=be)
                 for be in ["torch"] + (["triton"] if INTERPRET else [])}
        assert mode.syncs == syncs, mode.sync_sites
        slack = {be: got.detach().cpu() for be, got in slack.items()}
        grads = torch.autograd.grad(crf.sum(), leaves)  # back to the CPU leaves: a copy, which waits
        results = [t.detach().cpu() for t in (score, log_z, crf, hinge, value, top, y_hat, decoded)]
    score, log_z, crf, hinge, value, top, y_hat, decoded = results
    _assert_exact_or_inf("score", score, refs, "score", dtype, mag)
    _assert_exact_or_inf("log_partition", log_z, refs, "log_partition", dtype, mag)
    _assert_exact_or_inf("crf", crf, refs, "crf", dtype, mag)
    _assert_exact_or_inf("hinge", hinge, refs, "hinge", dtype, mag)
    _assert_exact_or_inf("max_oracle", value, refs, "value", dtype, mag)
    for be, got in slack.items():
        _assert_exact_or_inf(f"slack [{be}]", got, refs, "slack", dtype, 8 * mag)
    tol = 64 * torch.finfo(_out_dtype(dtype)).eps * mag
    for b in range(3):
        L = int(lengths[b])
        j = next(j for j in range(tabs[b].shape[0]) if torch.equal(tabs[b][j], y_hat[b, :L]))
        assert abs(refs[b]["augmented"][0][j] - refs[b]["value"][0]) <= tol  # a maximizer of the exact objective
        k = next(j for j in range(tabs[b].shape[0]) if torch.equal(tabs[b][j], decoded[b, :L]))
        scores = refs[b]["scores"][0]
        assert abs(scores[k] - max(scores)) <= tol  # decode: a maximizer of the score
    assert not any(bool(g.isnan().any()) for g in grads), grads
    exact = [t.detach().double().requires_grad_() for t in leaves]  # the same values, in float64
    try:
        cpu_crf = ts.crf_negative_log_likelihood(chain, ts.ChainPotentials(*exact), y, lengths, reduction="none")
    except OverflowError:  # a loss float64 cannot hold: the CPU raises, so no reference for the gradient
        assert dtype == torch.float64 and not bool(torch.isfinite(crf).all()), crf
        return
    want = torch.autograd.grad(cpu_crf, exact, grad_outputs=torch.ones_like(cpu_crf))
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.double(), w.double(), rtol=0, atol=1e-5)


def test_a_device_chains_torch_paths_bound_large_loss_weights_and_empty_batches():
    """The device guard's bound includes the loss weight (a number or a device tensor) without forming a product
    that overflows float32: a tensor loss weight of 1e38 gave NaN (its bound was inf, so nothing was scaled), a
    number of 1e39 a RuntimeError, and a number of 1e38 an oracle value of inf with a wrong labelling. The slack
    loss scales its margin with the potentials: where every labelling scores 0 (unary +-1e38 at alternate
    positions, partial sums up to 1e38 times the bound's 4 (3T + 1): scaled) it is ``max Delta (1 + 0) = 1``
    exactly, on the device (torch and Triton) and on the CPU in float64 at 1e308 (a margin left at 1 gives the
    scale, 2**s). An empty batch with per-position transitions gives empty results."""
    from torchssvm.testing import simulated_cuda

    chain = ts.Chain(2)
    y = torch.zeros(1, 4, dtype=torch.long)
    flat = ts.ChainPotentials(torch.full((1, 4, 2), 1e38), torch.zeros(2, 2))  # every labelling scores 4e38
    steps = ts.ChainPotentials(torch.tensor([[[2e38, 2e38], [2e38, 2e38], [-2e38, -2e38], [-2e38, -2e38]]]),
                               torch.zeros(2, 2))
    with simulated_cuda() as mode:
        def dev(pot):
            return ts.ChainPotentials(*(t.to("cuda", non_blocking=True) for t in pot[:2]))

        d_y = y.to("cuda", non_blocking=True)
        syncs = mode.syncs
        hinges = [ts.structured_hinge_loss(chain, dev(flat), d_y, loss_weight=lw, reduction="none", backend="torch")
                  for lw in (1e38, torch.full((1,), 1e38, dtype=torch.float64).to("cuda", non_blocking=True), 1e39)]
        y_hat, value = chain.max_oracle(dev(steps), d_y, loss_weight=1e38, backend="torch")
        tied = ts.ChainPotentials(torch.tensor([1e38, -1e38, 1e38, -1e38]).view(1, 4, 1).expand(1, 4, 2).contiguous(),
                                  torch.zeros(2, 2))
        slack = [ts.slack_rescaled_hinge_loss(chain, dev(tied), d_y, reduction="none", backend=be)
                 for be in ["torch"] + (["triton"] if INTERPRET else [])]
        empty = ts.ChainPotentials(torch.zeros(0, 3, 2).to("cuda", non_blocking=True),
                                   torch.zeros(0, 2, 2, 2).to("cuda", non_blocking=True))
        y0 = torch.zeros(0, 3, dtype=torch.long).to("cuda", non_blocking=True)
        empties = [chain.score(empty, y0), chain.log_partition(empty),
                   ts.crf_negative_log_likelihood(chain, empty, y0, reduction="none"),
                   ts.structured_hinge_loss(chain, empty, y0, reduction="none", backend="torch")]
        assert mode.syncs == syncs, mode.sync_sites
        hinges, y_hat, value = [h.cpu() for h in hinges], y_hat.cpu(), value.cpu()
        slack = [v.cpu() for v in slack]
        assert all(e.shape == (0,) for e in empties)
    # the exact hinges: lw * Delta with every position wrong, Delta = 1 (normalized Hamming); 1e39 has no float32
    assert hinges[0].tolist() == hinges[1].tolist() == [pytest.approx(1e38, rel=1e-6)]
    assert hinges[2].tolist() == [float("inf")]
    # the oracle: every label wrong in the first two positions (+1e38 loss weight, normalized: 2.5e37 each)
    want_y, want_v = chain.max_oracle(ts.ChainPotentials(steps.unary.double(), steps.transition.double()), y,
                                      loss_weight=1e38)
    assert torch.equal(y_hat, want_y) and value.tolist() == [pytest.approx(float(want_v), rel=1e-6)]
    assert all(v.tolist() == [1.0] for v in slack), slack
    tied64 = ts.ChainPotentials(torch.tensor([1e308, -1e308, 1e308, -1e308], dtype=torch.float64).view(1, 4, 1)
                                .expand(1, 4, 2).contiguous(), torch.zeros(2, 2, dtype=torch.float64))
    assert ts.slack_rescaled_hinge_loss(chain, tied64, y, reduction="none").tolist() == [1.0]
    assert chain.slack_max_oracle(tied64, y)[1].tolist() == [1.0]


class _KeywordChain(ts.Chain):
    """Hooks whose ``scale`` and ``margin`` are keyword-only, as `Unchecked` spells them."""

    def _slack_max_oracle(self, pot, lengths, target, backend, *, margin=1.0):
        return super()._slack_max_oracle(pot, lengths, target, backend, margin)

    def _log_partition(self, pot, lengths, *, scale=1.0):
        return super()._log_partition(pot, lengths, scale)


class _LegacyChain(ts.Chain):
    """A structure written before the hooks took the guard's ``scale`` and ``margin``."""

    def _slack_max_oracle(self, pot, lengths, target, backend):
        return super()._slack_max_oracle(pot, lengths, target, backend)

    def _log_partition(self, pot, lengths):
        return super()._log_partition(pot, lengths)


def test_hooks_without_the_guards_scale_still_work_and_are_never_scaled():
    """A `_slack_max_oracle` without ``margin`` or a `_log_partition` without ``scale`` is called without them: the
    same results as before on the CPU and on a device (where the guard then does not scale), and an OverflowError
    naming the potentials, not a TypeError, where float64 cannot hold their sums."""
    from torchssvm.testing import simulated_cuda

    old, new, keyword = _LegacyChain(3), ts.Chain(3), _KeywordChain(3)
    assert not old.unchecked.scalable("slack_max_oracle") and not old.unchecked.scalable("log_partition")
    assert new.unchecked.scalable("slack_max_oracle") and new.unchecked.scalable("log_partition")
    assert keyword.unchecked.scalable("slack_max_oracle") and keyword.unchecked.scalable("log_partition")
    with pytest.raises(ValueError, match="max_oracle"):
        new.unchecked.scalable("max_oracle")
    g = torch.Generator().manual_seed(3)
    pot = ts.ChainPotentials(torch.randn(2, 4, 3, generator=g), torch.randn(3, 3, generator=g))
    y = torch.randint(0, 3, (2, 4), generator=g)
    for chain in (old, new, keyword):
        cpu = [ts.slack_rescaled_hinge_loss(chain, pot, y, reduction="none"), chain.slack_max_oracle(pot, y)[1],
               ts.crf_negative_log_likelihood(chain, pot, y, reduction="none"), chain.log_partition(pot)]
        with simulated_cuda():
            d_pot = ts.ChainPotentials(*(t.to("cuda", non_blocking=True) for t in pot[:2]))
            d_y = y.to("cuda", non_blocking=True)
            dev = [ts.slack_rescaled_hinge_loss(chain, d_pot, d_y, reduction="none", backend="torch"),
                   chain.slack_max_oracle(d_pot, d_y, backend="torch")[1],
                   ts.crf_negative_log_likelihood(chain, d_pot, d_y, reduction="none"), chain.log_partition(d_pot)]
            dev = [t.detach().cpu() for t in dev]
        for a, b in zip(cpu, dev):
            torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-6)
    # every labelling scores 0, through partial sums of 1e308
    huge = ts.ChainPotentials(torch.tensor([1e308, -1e308, 1e308, -1e308], dtype=torch.float64).view(1, 4, 1)
                              .expand(1, 4, 3).contiguous(), torch.zeros(3, 3, dtype=torch.float64))
    y1 = y[:1]
    for call in (lambda c: ts.slack_rescaled_hinge_loss(c, huge, y1), lambda c: c.slack_max_oracle(huge, y1)[1],
                 lambda c: ts.crf_negative_log_likelihood(c, huge, y1), lambda c: c.log_partition(huge)):
        with pytest.raises(OverflowError, match="potentials"):
            call(old)
        assert bool(torch.isfinite(call(new)).all()) and torch.equal(call(keyword), call(new))


def _near_max_case(case, K, per_position, dtype, g):
    """Potentials (float64 values of ``dtype``) and a loss weight of ``case``: "spread" (uniform in +-0.9 max),
    "clustered" (all in [0.87, 0.9] max: every partial sum overflows, the hinges fit), "loss weight" (small
    potentials, a loss weight of 0.03 max), "transitions" (small unary, start and end; clustered transitions)."""
    top = 0.9 * torch.finfo(dtype).max
    B, T = 4, 6

    def draw(*shape, big=True):
        r = torch.rand(*shape, generator=g, dtype=torch.float64)
        if not big:
            return r * 2 - 1
        return top * (1 - r / 30) if case in ("clustered", "transitions") else top * (r * 2 - 1)

    small = case in ("loss weight", "transitions")  # the unary, start and end
    pot = [draw(B, T, K, big=not small), draw(*((B, T - 1) if per_position else ()), K, K, big=case != "loss weight"),
           draw(K, big=not small), draw(K, big=not small)]
    lw = top / 30 if case == "loss weight" else 1.0
    return [t.to(dtype).double() for t in pot], lw


NEAR_MAX = [(case, K, pp, dt) for case in ("spread", "clustered", "loss weight", "transitions")
            for K, pp in ((5, False), (5, True), (70, False), (70, True))
            for dt in ((torch.float32, torch.float64) if case == "clustered" else (torch.float32,))]


@pytest.mark.skipif(not INTERPRET, reason="needs triton and TRITON_INTERPRET=1")
@pytest.mark.parametrize("case,K,per_position,dtype", NEAR_MAX,
                         ids=[f"{c}-K{k}-{'pp' if p else 'shared'}-{str(d)[6:]}" for c, k, p, d in NEAR_MAX])
def test_a_device_chain_near_the_max_matches_the_exact_hinge_and_oracle(case, K, per_position, dtype):
    """Larger chains than the brute force can enumerate (the sequence kernel at K = 5, the GPU-wide one at K = 70,
    shared and per-position transitions), potentials and loss weights near the dtype's max, on the simulated
    device outside debug mode: the hinge and the loss-augmented value of the CPU's torch path in float64 (at
    ``2**-40`` of the scale, exact: a power of two) to the dtype's rounding of the sums; +-inf where they do not fit,
    never NaN; the device's labelling scores the optimum. Unguarded, these gave NaN and inf."""
    from torchssvm.testing import simulated_cuda

    g = torch.Generator().manual_seed(zlib.crc32(f"{case}-{K}-{per_position}-{dtype}".encode()))
    pot, lw = _near_max_case(case, K, per_position, dtype, g)
    B, T = pot[0].shape[:2]
    y = torch.randint(0, K, (B, T), generator=g)
    lengths = torch.tensor([6, 1, 4, 5])
    chain = ts.Chain(K)
    f = 2.0 ** -40
    low = ts.ChainPotentials(*(t * f for t in pot))
    ref = ts.structured_hinge_loss(chain, low, y, lengths, loss_weight=lw * f, reduction="none", backend="torch") / f
    _, ref_value = chain.max_oracle(low, y, lengths, loss_weight=lw * f, backend="torch")
    ref_value = ref_value / f
    with simulated_cuda():
        d_pot = ts.ChainPotentials(*(t.to(dtype).to("cuda", non_blocking=True) for t in pot))
        d_y, d_len = y.to("cuda", non_blocking=True), lengths.to("cuda", non_blocking=True)
        got = ts.structured_hinge_loss(chain, d_pot, d_y, d_len, loss_weight=lw, reduction="none").cpu()
        y_hat, value = (t.cpu() for t in chain.max_oracle(d_pot, d_y, d_len, loss_weight=lw))
    top = 0.9 * torch.finfo(dtype).max
    atol = 64 * torch.finfo(dtype).eps * T * 3 * top
    big = torch.finfo(dtype).max
    finite = 0
    for out, want in ((got, ref), (value, ref_value)):
        assert not bool(out.isnan().any()), out
        fits = want.abs() <= big
        assert torch.equal(out[~fits], want[~fits].sign() * float("inf")), (out, want)
        torch.testing.assert_close(out[fits].double(), want[fits], rtol=0, atol=atol)
        finite += int(fits.sum())
    # the device's labelling scores the optimum (its loss-augmented score, in float64 at the low scale)
    aug = (chain.score(low, y_hat, lengths) + lw * f * chain.task_loss(y_hat, y, lengths)) / f
    torch.testing.assert_close(aug, ref_value, rtol=0, atol=atol)
    if case != "spread":  # there every result is past the max: the +-inf and the labelling are what is checked
        assert finite >= 4, (got, value)  # the comparison is not empty


def test_the_guard_scales_a_spatial_trees_weights_not_its_rest_offsets():
    """float64 potentials near 1.8e308 are computed at ``2**-shift`` of their size: a spatial tree's score, oracle
    value and hinge are homogeneous in its unary and weights, not in its rest offsets (they enter through
    ``|l_c - l_p - r|^2``), which the scaling must leave alone. At ``2**1021`` of ordinary potentials (with their
    loss weight) every result is that power of two times the ordinary one, bitwise; scaling the offsets too gave
    1.9999e307 for a score of 0."""
    st = ts.SpatialTree([-1, 0], 2, 2, loss="hamming")
    g = torch.Generator().manual_seed(1)
    u = torch.randn(3, 2, 4, dtype=torch.float64, generator=g)
    w = torch.tensor([[0.3, 1.0, -0.2, 0.5]], dtype=torch.float64)
    rest = torch.tensor([[0.75, -1.25]], dtype=torch.float64)
    y = torch.randint(0, 4, (3, 2), generator=g)
    k = torch.tensor(1021)
    small = ts.SpatialTreePotentials(u, w, rest)
    big = ts.SpatialTreePotentials(torch.ldexp(u, k), torch.ldexp(w, k), rest)
    mags = {"unary": float(big.unary.abs().max()), "weights": float(big.weights.abs().max()), "rest": 1.25}
    assert st.unchecked.overflow_plan(st.tensors(big), mags, homogeneous=True)[1] > 0  # the scaled path
    assert torch.equal(st.score(big, y), torch.ldexp(st.score(small, y), k))
    for backend in BACKENDS["spatial_tree"]:
        y_s, v_s = st.max_oracle(small, y, loss_weight=1.0, backend=backend)
        y_b, v_b = st.max_oracle(big, y, loss_weight=2.0 ** 1021, backend=backend)
        assert torch.equal(y_b, y_s) and torch.equal(v_b, torch.ldexp(v_s, k)), backend
        h_s = ts.structured_hinge_loss(st, small, y, reduction="none", backend=backend)
        h_b = ts.structured_hinge_loss(st, big, y, loss_weight=2.0 ** 1021, reduction="none", backend=backend)
        assert torch.equal(h_b, torch.ldexp(h_s, k)), backend


def test_logsumexp_scaled_is_torchs_value_with_a_normalised_gradient():
    """`logsumexp_scaled` at scale 1 gives `torch.logsumexp`'s value bitwise (+-inf rows included); its gradient is
    the softmax, which sums to 1 where `torch.logsumexp`'s ``exp(x - result)`` does not: float32 logits of 1e8 lose
    ``log 2`` in the rounding, and the CRF's gradient came out as ``[0, 1, 0]`` for ``[-0.5, 0.5, 0]``."""
    from torchssvm.structures.base import logsumexp_scaled

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for i in range(40):
            x = torch.randn(5, 6, 4, generator=g, dtype=dtype) * 10.0 ** (i % 40 - 5)
            x[0, 0] = -math.inf
            x[1] = -math.inf
            x[2, 1, 2] = math.inf
            for dim in range(3):
                torch.testing.assert_close(logsumexp_scaled(x, dim), torch.logsumexp(x, dim), rtol=0, atol=0,
                                           equal_nan=True)
    x = torch.tensor([[1e8, 1e8, 0.0]], requires_grad=True)
    ts.crf_negative_log_likelihood(ts.Multiclass(3), x, torch.tensor([0])).backward()
    assert x.grad.tolist() == [[-0.5, 0.5, 0.0]]
    unary = torch.tensor([[[1e8, 1e8], [0.0, 0.0]]], requires_grad=True)
    ts.crf_negative_log_likelihood(ts.Chain(2), ts.ChainPotentials(unary, torch.zeros(2, 2)),
                                   torch.tensor([[0, 0]])).backward()
    assert unary.grad.tolist() == [[[-0.5, 0.5], [-0.5, 0.5]]]
    # at a power-of-two scale: the same value and gradient as the unscaled log-sum-exp, where that one fits
    x = torch.randn(4, 9, generator=g, dtype=torch.float64, requires_grad=True)
    c = 2.0 ** 7
    got = c * logsumexp_scaled(x / c, 1, c)
    torch.testing.assert_close(got, torch.logsumexp(x, 1))
    (grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(grad, torch.softmax(x, 1))


# ------------------------------------------------------------------------------------------- the small errors
@pytest.mark.parametrize("loss", [ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss,
                                  ts.crf_negative_log_likelihood])
def test_target_none_is_a_type_error_naming_target(loss):
    pot = ts.ChainPotentials(torch.randn(2, 3, 2), torch.randn(2, 2))
    with pytest.raises(TypeError, match="target must be a torch.Tensor"):
        loss(ts.Chain(2), pot, None)
    with pytest.raises(TypeError, match="target must be a torch.Tensor"):
        loss(ts.Multiclass(3), torch.randn(2, 3), [0, 1])


def test_modules_name_target_too():
    pot = ts.ChainPotentials(torch.randn(2, 3, 2), torch.randn(2, 2))
    for crit in (ts.StructuredHingeLoss(ts.Chain(2)), ts.SlackRescaledHingeLoss(ts.Chain(2)), ts.CRFLoss(ts.Chain(2))):
        with pytest.raises(TypeError, match="target"):
            crit(pot, None)


@pytest.mark.parametrize("bad", [torch.int64, torch.bool, "float32", torch.complex64])
def test_model_dtype_must_be_a_floating_torch_dtype(bad):
    for make in (lambda: ts.LinearChainModel(3, 4, dtype=bad),
                 lambda: ts.models.LinearMulticlassModel(3, 4, dtype=bad)):
        with pytest.raises(TypeError, match="dtype"):
            make()


def test_model_constructors_name_their_other_arguments():
    with pytest.raises(TypeError, match="sparse"):
        ts.LinearChainModel(3, 4, sparse="yes")
    with pytest.raises(ValueError, match="bias"):
        ts.LinearChainModel(3, 4, bias=["ocr"])
    with pytest.raises(TypeError, match="bias"):
        ts.models.LinearMulticlassModel(3, 4, bias="yes")
    with pytest.raises((TypeError, ValueError), match="device"):
        ts.LinearChainModel(3, 4, device=1.5)
    with pytest.raises((TypeError, ValueError), match="device"):
        ts.models.LinearMulticlassModel(3, 4, device="nowhere")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ts.models.joint_feature(None, torch.zeros(1, 3), torch.zeros(1, 4))
    assert ts.LinearChainModel(3, 4, dtype=torch.float64, device="cpu").emission.dtype == torch.float64


def test_return_argmax_must_be_a_bool():
    with pytest.raises(TypeError, match="return_argmax"):
        ts.structured_hinge_loss(ts.Multiclass(3), torch.randn(2, 3), torch.tensor([0, 1]), return_argmax="yes")


def test_the_batch_mean_and_sum_accumulate_where_they_cannot_overflow():
    """Per-example float32 losses near 3.4e38 summed to inf in float32: the mean is now exact, a sum float32 cannot
    hold an OverflowError; a float64 mean near 1.8e308 is exact too."""
    mc = ts.Multiclass(3)
    s = torch.tensor([[2e38, -1e38, 0.0]] * 3, requires_grad=True)
    t = torch.tensor([2, 2, 2])
    loss = ts.structured_hinge_loss(mc, s, t)
    assert loss.dtype == torch.float32 and float(loss.detach()) == pytest.approx(2e38)
    loss.backward()
    torch.testing.assert_close(s.grad, torch.tensor([[1 / 3, 0.0, -1 / 3]] * 3))
    with pytest.raises(OverflowError, match="the sum of the losses is 6.0.*e\\+38.*float32"):
        ts.structured_hinge_loss(mc, s, t, reduction="sum")
    s64 = torch.tensor([[1.5e308, -1e308, 0.0]] * 3, dtype=torch.float64)
    assert float(ts.structured_hinge_loss(mc, s64, t)) == pytest.approx(1.5e308)
    # the CRF is homogeneous too with its log-sum-exp at temperature 2**-shift, the exact slack-rescaled loss with
    # its margin 2**-shift; the searches over lambda-oracles form the products themselves: not scaled
    assert float(ts.crf_negative_log_likelihood(mc, s64, t)) == pytest.approx(1.5e308)
    assert float(ts.slack_rescaled_hinge_loss(mc, s64, t)) == pytest.approx(1.5e308)
    with pytest.raises(OverflowError, match="potentials.*overflows float64"):
        ts.slack_rescaled_hinge_loss(mc, s64, t, search="bisecting")
    with pytest.raises(OverflowError, match="sum of the losses overflows float64"):
        ts.structured_hinge_loss(mc, s64, t, reduction="sum")


def test_a_device_batch_mean_accumulates_where_it_cannot_overflow():
    """On a (simulated) CUDA device nothing is read: float32 hinges near 3.4e38 are averaged in float64 (their
    float32 mean was inf), float64 ones near 1.8e308 at 2**-k of their size; a sum that does not fit is +inf (the CPU
    raises). Ordinary means equal the CPU's, bitwise: both accumulate in float64."""
    from torchssvm.testing import simulated_cuda

    mc = ts.Multiclass(3)
    t = torch.tensor([2, 2, 2])
    g = torch.Generator().manual_seed(0)
    ordinary = torch.randn(5, 3, generator=g)
    with simulated_cuda() as mode:
        d_t = t.to("cuda", non_blocking=True)
        big = torch.tensor([[2e38, -1e38, 0.0]] * 3).to("cuda", non_blocking=True)
        big64 = torch.tensor([[1.5e308, -1e308, 0.0]] * 3, dtype=torch.float64).to("cuda", non_blocking=True)
        d_ord = ordinary.to("cuda", non_blocking=True)
        d_ot = torch.tensor([0, 1, 2, 0, 1]).to("cuda", non_blocking=True)

        def reduced(loss, scores, target, reduction="mean"):
            # Multiclass reads its scores and labels on every device; the reduction adds no read of its own
            syncs = mode.syncs
            loss(mc, scores, target, reduction="none")
            per_call = mode.syncs - syncs
            syncs = mode.syncs
            out = loss(mc, scores, target, reduction=reduction)
            assert mode.syncs - syncs == per_call, mode.sync_sites
            return out

        previous = ts.set_debug(False)
        try:
            out = [reduced(ts.structured_hinge_loss, big, d_t), reduced(ts.structured_hinge_loss, big, d_t, "sum"),
                   reduced(ts.structured_hinge_loss, big64, d_t), reduced(ts.crf_negative_log_likelihood, big, d_t),
                   reduced(ts.structured_hinge_loss, d_ord, d_ot)]
        finally:
            ts.set_debug(previous)
        out = [float(x.cpu()) for x in out]
    assert out[0] == pytest.approx(2e38) and out[1] == float("inf") and out[2] == pytest.approx(1.5e308)
    assert out[3] == pytest.approx(2e38)
    assert out[4] == float(ts.structured_hinge_loss(mc, ordinary, torch.tensor([0, 1, 2, 0, 1])))


@pytest.mark.parametrize("which", ["multilabel", "hierarchy"])
def test_a_loss_weight_past_the_dtype_times_a_small_cost_fits(which):
    """``loss_weight`` 1e39 (past float32) times class weights 1e-20: every weighted cost is about 1e19, which
    float32 holds, so float32 potentials give the float64 hinge to float32's rounding, not +inf (the weight cast to
    float32 alone first) or a refusal."""
    g = torch.Generator().manual_seed(0)
    if which == "multilabel":
        s = ts.MultiLabel(3, class_weights=torch.full((3,), 1e-20, dtype=torch.float64))
        pot = ts.MultiLabelPotentials(torch.randn(2, 3, generator=g), torch.randn(3, generator=g))
        pot64 = ts.MultiLabelPotentials(*(t.double() for t in pot))
        y = torch.tensor([[0, 1, 1], [1, 0, 0]])
    else:
        s = ts.Hierarchy([-1, 0, 0, -1], class_weights=torch.full((4,), 1e-20, dtype=torch.float64))
        pot = torch.randn(2, 4, generator=g)
        pot64 = pot.double()
        y = s.configurations()[torch.tensor([1, 4])]
    exact = ts.structured_hinge_loss(s, pot64, y, loss_weight=1e39, reduction="none")
    for lw in (1e39, torch.tensor([1e39, 1e39], dtype=torch.float64)):
        got = ts.structured_hinge_loss(s, pot, y, loss_weight=lw, reduction="none")
        assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
        torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=0.0)


def test_sparse_potentials_are_refused_naming_them():
    u = torch.randn(2, 3, 4).to_sparse()
    with pytest.raises(TypeError, match="unary must be a dense tensor, got layout torch.sparse_coo"):
        ts.Chain(4).decode(ts.ChainPotentials(u, torch.randn(4, 4)))


def test_problem_features_whose_squares_overflow_are_refused():
    ds = ts.data.synthetic_chain("train", n=4, num_labels=3, num_features=5, seed=0, dtype=torch.float64)
    model = ts.models.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)
    big = ts.data.SequenceDataset(ds.x * 1e160, ds.y, ds.lengths, num_labels=3, num_features=5)
    with pytest.raises(ValueError, match="dataset.x: its squared norms overflow float64"):
        ts.optim.BCFW(model, big, lam=0.1)
    ts.optim.BCFW(model, ts.data.SequenceDataset(ds.x * 1e150, ds.y, ds.lengths, num_labels=3, num_features=5),
                  lam=0.1)
