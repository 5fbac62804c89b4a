"""The simulated CUDA device (`simulated_cuda`) that CI runs `tests/test_gpu.py` on: it must compute what the CPU
computes, refuse what a GPU refuses, and count the host synchronisations; and the mini-batch BCFW step's count
of them, which on a GPU is the step's fixed cost."""

import pytest
import torch

import torchssvm as ts
from torchssvm.testing import SimulatedCudaTensor, simulated_cuda


def test_device_tensors_compute_what_the_cpu_computes():
    g = torch.Generator().manual_seed(0)
    x, idx = torch.randn(4, 5, 3, generator=g), torch.tensor([2, 0])
    ref = x.clone()
    ref[:, idx] = ref[:, [1, 3]] * 2
    ref = ref.unsqueeze(0)
    with simulated_cuda() as mode:
        d = x.to("cuda")
        assert isinstance(d, SimulatedCudaTensor) and d.device == torch.device("cuda", 0) and d.is_cuda
        d[:, idx.cuda()] = d[:, [1, 3]] * 2  # tensor and list indices; lists used to read data-less tensors
        assert d.unsqueeze_(0) is d and d.shape == ref.shape  # in-place shape changes follow the data
        assert torch.zeros(3, device=d.device).device == d.device
        assert torch.tensor([1.0], device="cuda").device == d.device
        w = torch.ones(5, 3, device="cuda", requires_grad=True)
        (w * d).sum().backward()
        assert mode.syncs == 0  # none of the above waits for the device
        assert torch.equal(d.cpu(), ref) and type(d.cpu()) is torch.Tensor
        assert torch.equal(w.grad.cpu(), ref.sum((0, 1)))
        assert mode.syncs == 3  # the copies to the host
        bool((d > 0).any()), d.sum().item(), d[d > 0], d.tolist()
        assert mode.syncs == 7


def test_mixing_devices_raises_as_on_a_gpu():
    with simulated_cuda():
        d = torch.ones(3, device="cuda")
        with pytest.raises(RuntimeError, match="same device"):
            d + torch.ones(3)  # a tensor made without device=
        assert (d * torch.tensor(2.0)).device == d.device  # 0-dim CPU tensors are allowed, as on CUDA
        assert d[torch.tensor([0, 2])].shape == (2,)  # CPU index tensors too
        with pytest.raises(TypeError, match="numpy"):
            d.numpy()


def _syncs_per_minibatch(B, **config):
    ds = ts.data.synthetic_chain("train", 128, num_labels=8, num_features=20, seed=0)
    with simulated_cuda() as mode:
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device="cuda")
        s = ts.optim.BCFW(model, ds.to("cuda"), lam=0.01, batch_size=B, seed=0, backend="torch", **config)
        s.step()  # the first pass visits every block once
        before = mode.syncs
        for _ in range(2):
            s.step()
        assert s.w.device == torch.device("cuda", 0)
    return (mode.syncs - before) / (2 * 128 / B)


@pytest.mark.parametrize("config", [{}, {"sampling": "gap", "step": "pairwise", "cache_size": 10,
                                          "gap_check_every": 5}])
def test_minibatch_bcfw_step_waits_for_the_device_a_bounded_number_of_times(config):
    """Host synchronisations per mini-batch step stay a few dozen whatever the batch (no per-block host loop):
    9 and 10 for plain FW steps at B = 16 and 64, 29 and 31 with pairwise steps and a cache, mostly the cache's
    hit/miss masks and the oracle on the misses (docs/benchmarks/host_syncs.md). Before the box QP of B <= 64
    was solved on the host from one copy and the batch's longest sentence was remembered per ``idx``: 21 and
    31, 40 and 47."""
    small, large = _syncs_per_minibatch(16, **config), _syncs_per_minibatch(64, **config)
    assert 0 < small <= 40 and 0 < large <= 40
    assert large <= 1.5 * small  # for 4x the blocks
