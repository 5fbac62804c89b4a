"""Slack-rescaling searches (seed 000): angular search's exactness, the Thm 1 instance, Lemma 4
monotonicity and the Lemma 5 certificates, on enumerated problems and on chains."""

import math

import pytest
import torch

import torchssvm as ts
from torchssvm.search import (
    StructureOracle,
    TableOracle,
    angular_search,
    binary_search,
    bisecting_search,
    golden_search,
)


def _random_table(B, N, seed, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # ties in h, g and Phi
        h = torch.randint(-3, 4, (B, N), generator=g).double()
        gg = torch.randint(0, 4, (B, N), generator=g).double()
    else:
        h = torch.randn(B, N, generator=g, dtype=torch.float64) * 2 + 0.5
        gg = torch.rand(B, N, generator=g, dtype=torch.float64) * 3
    h[:, 0], gg[:, 0] = 1.0, 0.0  # the truth: h = 1, g = 0
    return TableOracle(h, gg)


def _true_max(oracle):
    phi = torch.where((oracle.h > 0) & (oracle.g > 0), oracle.h * oracle.g, torch.zeros_like(oracle.h))
    return phi.max(1).values


def _positive_count(oracle):
    return ((oracle.h > 0) & (oracle.g > 0)).sum(1)


@pytest.mark.parametrize("queue", ["fifo", "priority"])
@pytest.mark.parametrize("integer", [False, True])
def test_angular_search_is_exact_within_2m_plus_1_calls(queue, integer):
    for N, seed in [(2, 0), (5, 1), (12, 2), (40, 3)]:
        oracle = _random_table(64, N, seed, integer)
        r = angular_search(oracle, queue=queue, tol=1.0)
        torch.testing.assert_close(r.phi, _true_max(oracle), rtol=1e-12, atol=1e-12)
        assert bool((r.calls <= 2 * _positive_count(oracle) + 1).all())
        assert bool((r.bound >= r.phi - 1e-12).all())
        # the labelling reported attains phi
        rows = torch.arange(64)
        phi_at = oracle.h[rows, r.labels] * oracle.g[rows, r.labels]
        phi_at = torch.where(r.phi > 0, phi_at, torch.zeros(64, dtype=torch.float64))
        torch.testing.assert_close(phi_at, r.phi, rtol=1e-12, atol=1e-12)


def _theorem1(B=8, eps=1e-3, H=10.0, G=8.0, below=1e-6):
    """Thm 1: A = (eps, G), B = (H, eps) and C = (H/2, G/2) just under the segment AB, plus the truth."""
    h = torch.tensor([[1.0, eps, H, H / 2]], dtype=torch.float64).repeat(B, 1)
    g = torch.tensor([[0.0, G, eps, G / 2 - below]], dtype=torch.float64).repeat(B, 1)
    return TableOracle(h, g)


def test_theorem1_instance_defeats_lambda_oracle_searches_but_not_angular():
    eps, H, G = 1e-3, 10.0, 8.0
    worst = max(eps * G, eps * H)
    for search in (lambda o: bisecting_search(o, torch.rand(8, dtype=torch.float64) * 10 + 0.01),
                   lambda o: binary_search(o), lambda o: golden_search(o, torch.zeros(8, dtype=torch.float64)),
                   lambda o: golden_search(o, torch.full((8,), 5.0, dtype=torch.float64))):
        r = search(_theorem1())
        assert bool((r.phi <= worst + 1e-12).all())  # never sees C
        assert bool((r.bound >= H * G / 4 - 1e-6).all())  # ... but its certificate says it may be far
    r = angular_search(_theorem1(), tol=1.0)
    torch.testing.assert_close(r.phi, torch.full((8,), H / 2 * (G / 2 - 1e-6), dtype=torch.float64))
    assert torch.equal(r.labels, torch.full((8,), 3))


@pytest.mark.parametrize("queue", ["fifo", "priority"])
def test_angular_label_cache_prunes_and_stays_exact(queue):
    """Note 000 section 2.6: cached labellings start the incumbent. On the Thm 1 instance plain angular
    needs 5 calls to reach C; with C cached the 0.999 stop holds after the root call."""
    plain = angular_search(_theorem1(), queue=queue)
    cache = torch.tensor([[-1, 3]]).repeat(8, 1)  # an empty slot and C
    r = angular_search(_theorem1(), queue=queue, cache=cache)
    torch.testing.assert_close(r.phi, plain.phi, rtol=0, atol=0)
    assert r.labels.tolist() == [3] * 8 and plain.calls.tolist() == [5] * 8 and r.calls.tolist() == [1] * 8
    assert bool((r.bound >= r.phi - 1e-12).all())
    # a cache that holds only non-violating labellings changes nothing
    same = angular_search(_theorem1(), queue=queue, cache=torch.zeros(8, 1, dtype=torch.long))
    assert torch.equal(same.calls, plain.calls) and torch.equal(same.labels, plain.labels)
    with pytest.raises(ValueError, match="columns"):
        angular_search(_theorem1(), cache=torch.full((8, 1), 4))


def test_lemma4_monotonicity_tables_and_chains():
    lams = torch.logspace(-3, 3, 40, dtype=torch.float64)
    oracle = _random_table(16, 30, 5)
    prev = None
    for lam in lams:
        a = oracle(torch.full((16,), float(lam), dtype=torch.float64))
        if prev is not None:
            assert bool((a.h <= prev.h + 1e-12).all()) and bool((a.g >= prev.g - 1e-12).all())
        prev = a
    g = torch.Generator().manual_seed(0)
    pot = ts.ChainPotentials(torch.randn(12, 6, 4, generator=g, dtype=torch.float64),
                             torch.randn(4, 4, generator=g, dtype=torch.float64))
    y = torch.randint(0, 4, (12, 6), generator=g)
    chain_oracle = StructureOracle(ts.Chain(4), pot, y)
    prev = None
    for lam in lams:
        a = chain_oracle(torch.full((12,), float(lam), dtype=torch.float64))
        if prev is not None:
            assert bool((a.h <= prev.h + 1e-9).all()) and bool((a.g >= prev.g - 1e-9).all())
        prev = a


def test_certificates_hold_for_every_search():
    oracle_args = [(48, 25, s) for s in range(3)]
    for B, N, seed in oracle_args:
        truth = _true_max(_random_table(B, N, seed))
        results = [bisecting_search(_random_table(B, N, seed)), binary_search(_random_table(B, N, seed)),
                   golden_search(_random_table(B, N, seed), torch.rand(B, dtype=torch.float64)),
                   angular_search(_random_table(B, N, seed)),
                   angular_search(_random_table(B, N, seed), queue="priority")]
        for r in results:
            assert bool((r.phi <= truth + 1e-12).all())
            assert bool((r.bound >= truth - 1e-9).all())
        # the 0.999 stop: within the tolerance of the optimum
        assert bool((results[3].phi >= 0.999 * truth - 1e-12).all())


@pytest.mark.parametrize("queue", ["fifo", "priority"])
@pytest.mark.parametrize("tol", [0.5, 0.9])
def test_angular_bound_stays_certified_when_tol_stops_early(queue, tol):
    """A loose ``tol`` closes wedges unvisited; their bounds stay in the certificate: phi <= max <= bound and
    phi >= tol * bound where tol stopped the search (these tables stop early in some rows at either tol)."""
    for seed in range(6):
        oracle = _random_table(64, 30, seed)
        truth = _true_max(oracle)
        r = angular_search(oracle, queue=queue, tol=tol)
        assert bool((r.phi <= truth + 1e-12).all())
        assert bool((r.bound >= truth - 1e-12).all())
        assert bool((r.phi >= tol * r.bound - 1e-12).all())
    # a 4-labelling table where tol = 0.9 closes the wedge holding the maximum (25) with the incumbent at 24
    h = torch.tensor([[1.0, 4.0, 6.0, 5.0]], dtype=torch.float64)
    g = torch.tensor([[0.0, 6.0, 2.0, 5.0]], dtype=torch.float64)
    r = angular_search(TableOracle(h, g), queue=queue, tol=0.9)
    assert float(r.bound) >= 25.0


def test_searches_on_chains_against_the_exact_dp():
    g = torch.Generator().manual_seed(3)
    chain = ts.Chain(5)
    B, T = 32, 8
    pot = ts.ChainPotentials(torch.randn(B, T, 5, generator=g, dtype=torch.float64),
                             torch.randn(5, 5, generator=g, dtype=torch.float64))
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    y = torch.randint(0, 5, (B, T), generator=g)
    _, exact = chain.slack_max_oracle(pot, y, lengths)
    for r in (bisecting_search(StructureOracle(chain, pot, y, lengths)),
              binary_search(StructureOracle(chain, pot, y, lengths)),
              golden_search(StructureOracle(chain, pot, y, lengths), torch.zeros(B, dtype=torch.float64))):
        assert bool((r.phi <= exact + 1e-9).all()) and bool((r.bound >= exact - 1e-9).all())
        # the labelling reported is a real one with that violation
        s_hat, s_gold = chain.score(pot, r.labels, lengths), chain.score(pot, y, lengths)
        phi = chain.task_loss(r.labels, y, lengths) * (1 + s_hat - s_gold)
        torch.testing.assert_close(phi.clamp_min(0), r.phi, rtol=1e-9, atol=1e-9)
        assert float((r.phi >= exact - 1e-9).double().mean()) > 0.5  # mostly exact on these small chains
    max_g = StructureOracle(chain, pot, y, lengths).max_g()  # normalized Hamming: every label wrong costs 1
    torch.testing.assert_close(max_g, torch.ones_like(max_g), rtol=1e-12, atol=1e-12)


def test_table_oracle_from_structures_matches_the_exact_oracles():
    g = torch.Generator().manual_seed(1)
    ml = ts.MultiLabel(6)
    pot = ts.MultiLabelPotentials(torch.randn(20, 6, generator=g, dtype=torch.float64),
                                  torch.randn(ml.num_edges, generator=g, dtype=torch.float64))
    y = torch.randint(0, 2, (20, 6), generator=g)
    oracle = TableOracle.from_structure(ml, pot, y)
    r = angular_search(oracle, tol=1.0)
    _, exact = ml.slack_max_oracle(pot, y)
    torch.testing.assert_close(r.phi, exact, rtol=1e-12, atol=1e-12)
    assert r.labels.shape == (20, 6)
    s = torch.randn(30, 7, generator=g, dtype=torch.float64)
    yc = torch.randint(0, 7, (30,), generator=g)
    r = angular_search(TableOracle.from_structure(ts.Multiclass(7), s, yc), tol=1.0)
    torch.testing.assert_close(r.phi, ts.Multiclass(7).slack_max_oracle(s, yc)[1], rtol=1e-12, atol=1e-12)
    # the lambda-oracle of the table is the structure's loss-augmented decoding
    lam = torch.rand(20, generator=g, dtype=torch.float64) * 4
    a = oracle(lam)
    y_aug, _ = ml.max_oracle(pot, y, loss_weight=lam)
    assert torch.equal(oracle.labelling(a.labels), y_aug)


def test_search_errors():
    oracle = _random_table(2, 3, 0)
    with pytest.raises(ValueError, match="queue"):
        angular_search(oracle, queue="lifo")
    with pytest.raises(ValueError, match="tol"):
        angular_search(oracle, tol=1.5)
    with pytest.raises(ValueError, match="lam0"):
        bisecting_search(oracle, torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="lam_min"):
        binary_search(oracle, lam_min=2.0, lam_max=1.0)
    with pytest.raises(ValueError, match="xi"):
        golden_search(oracle, torch.tensor([-1.0, 0.0]))
    nan, inf = float("nan"), float("inf")
    # a multiplier that is not finite and > 0, or not one per example (angular: lam0 < 0 gave a negative root
    # bound, and reported the incumbent as a certificate below the true maximum)
    for bad in ([-1.0, -1.0], [0.0, 1.0], [inf, 1.0], [nan, 1.0], [1.0], [1.0, 1.0, 1.0]):
        for search in (angular_search, bisecting_search):
            with pytest.raises(ValueError, match="lam0"):
                search(oracle, lam0=torch.tensor(bad, dtype=torch.float64))
    with pytest.raises(ValueError, match="xi"):
        golden_search(oracle, torch.tensor([nan, 0.0]))
    with pytest.raises(ValueError, match="xi"):
        golden_search(oracle, torch.zeros(3))
    for kwargs, name in (({"lam_max": inf}, "lam_max"), ({"lam_min": nan}, "lam_min"), ({"tol": -1.0}, "tol")):
        with pytest.raises(ValueError, match=name):
            binary_search(oracle, **kwargs)
    for kwargs, name in (({"lam_max": -1.0}, "lam_max"), ({"lam_max": nan}, "lam_max"), ({"lam_max": 0.0}, "lam_max"),
                         ({"tol": nan}, "tol")):
        with pytest.raises(ValueError, match=name):
            golden_search(oracle, torch.zeros(2), **kwargs)
    with pytest.raises(ValueError, match="tol"):
        bisecting_search(oracle, tol=-1.0)
    h, g = oracle.h.clone(), oracle.g.clone()
    for bad_h, bad_g, name in ((h.index_fill(1, torch.tensor([1]), nan), g, "h"),
                               (h, g.index_fill(1, torch.tensor([1]), inf), "g")):
        with pytest.raises(ValueError, match=name):
            TableOracle(bad_h, bad_g)
    with pytest.raises(ValueError, match="truth"):
        TableOracle(h, g, truth=torch.tensor([0, 7]))
    with pytest.raises(ValueError, match="labels"):
        TableOracle(h, g, labels=torch.zeros(h.shape[1] + 1, 2))
    with pytest.raises(ValueError, match="truth"):  # no g = 0 column to take as the truth
        TableOracle(h, g + 1.0)
    for search in (bisecting_search, binary_search, lambda o, **kw: golden_search(o, torch.zeros(2), **kw)):
        with pytest.raises(ValueError, match="max_calls"):
            search(oracle, max_calls=0)
    with pytest.raises(ValueError, match="max_calls"):
        angular_search(oracle, max_calls=-1)
    # calls counts this search's calls, also when the oracle is reused (its own total keeps running)
    reused = _random_table(2, 3, 0)
    first, second = bisecting_search(reused), bisecting_search(reused)
    assert torch.equal(first.calls, second.calls) and torch.equal(reused.calls, first.calls + second.calls)
    # one call allowed: exactly one made (golden's first point)
    assert golden_search(_random_table(2, 3, 0), torch.zeros(2), max_calls=1).calls.tolist() == [1, 1]
    with pytest.raises(ValueError, match=">= 0"):
        TableOracle(torch.zeros(1, 2), -torch.ones(1, 2))
    with pytest.raises(NotImplementedError, match="constrained"):
        StructureOracle(ts.Chain(2), ts.ChainPotentials(torch.zeros(1, 2, 2), torch.zeros(2, 2)),
                        torch.zeros(1, 2, dtype=torch.long)).constrained()
    assert math.isfinite(float(angular_search(oracle).bound.max()))
