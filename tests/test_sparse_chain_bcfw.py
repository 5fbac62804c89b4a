"""The sparse-block BCFW baseline of scripts/bench_gdmm.py against the library's BCFW."""

import sys
from pathlib import Path

import torch

import torchssvm as ts
from torchssvm.optim import BCFW
from torchssvm.structures import Chain

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from _sparse_chain_bcfw import SparseChainBCFW  # noqa: E402


def test_same_iterates_as_the_library_bcfw():
    """Same seed, same block order: the feature-space sparse blocks give the library's iterates."""
    data = ts.data.synthetic_chain("train", n=6, num_labels=4, num_features=3, max_length=5, seed=7)
    st = Chain(4, normalize=False)
    lam = 1.0 / len(data)
    lib = BCFW(ts.models.LinearChainModel(3, 4, dtype=torch.float64), data, lam=lam, structure=st,
               gap_check_every=0)
    model = ts.models.LinearChainModel(3, 4, dtype=torch.float64)
    s = SparseChainBCFW(model, data, lam, structure=st)
    for _ in range(30):
        r = s.step()
        lib.step()
        assert abs(r["dual"] - lib.dual_value()) <= 1e-10 * (1 + abs(r["dual"]))
    w = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    assert torch.allclose(w, lib.w, atol=1e-10)
    assert abs(s.primal() - lib.duality_gap()["primal"]) <= 1e-10
    # the blocks add up to w
    v = torch.zeros(16, dtype=torch.float64)
    for idx, val in zip(s.tidx, s.tval):
        v.index_add_(0, idx, val)
    assert torch.allclose(s.E.sum(0), s.W, atol=1e-12) and torch.allclose(v.view(4, 4), s.v, atol=1e-12)
