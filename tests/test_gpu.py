"""CUDA tests: the Triton kernel and the torch twin on the GPU. Skipped without CUDA."""

import pytest
import torch
from torchssvm.kernels import viterbi_torch

import torchssvm as ts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("B,T,K,per_position", [(64, 30, 26, False), (33, 17, 45, True), (8, 12, 300, False),
                                                 (4, 6, 1024, False), (512, 100, 45, False)])
def test_triton_equals_torch_on_cuda(B, T, K, per_position):
    from torchssvm.kernels.viterbi_triton import viterbi_triton

    g = torch.Generator().manual_seed(K)
    unary = torch.randint(-3, 4, (B, T, K), generator=g).float().cuda()
    trans = torch.randint(-3, 4, (B, T - 1, K, K) if per_position else (K, K), generator=g).float().cuda()
    start, end = torch.randn(K, generator=g).cuda(), torch.randn(K, generator=g).cuda()
    lengths = torch.randint(1, T + 1, (B,), generator=g).cuda()
    a = viterbi_torch(unary, trans, start, end, lengths)
    b = viterbi_triton(unary, trans, start, end, lengths)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    cpu = viterbi_torch(unary.cpu(), trans.cpu(), start.cpu(), end.cpu(), lengths.cpu())
    assert torch.equal(cpu[0], a[0].cpu())


def test_hinge_on_cuda_matches_cpu():
    g = torch.Generator().manual_seed(0)
    B, T, K = 16, 10, 12
    pot = ts.ChainPotentials(torch.randn(B, T, K, generator=g), torch.randn(K, K, generator=g))
    y = torch.randint(0, K, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    chain = ts.Chain(K)
    cpu_pot = ts.ChainPotentials(*(t.clone().requires_grad_() for t in pot))
    gpu_pot = ts.ChainPotentials(*(t.cuda().requires_grad_() for t in pot))
    cpu_loss = ts.StructuredHingeLoss(chain)(cpu_pot, y, lengths)
    cpu_loss.backward()
    loss = ts.StructuredHingeLoss(chain)(gpu_pot, y.cuda(), lengths.cuda())  # auto: Triton on CUDA
    loss.backward()
    assert float(loss) == pytest.approx(float(cpu_loss), rel=1e-5)
    assert torch.allclose(gpu_pot.unary.grad.cpu(), cpu_pot.unary.grad)
    assert torch.allclose(gpu_pot.transition.grad.cpu(), cpu_pot.transition.grad)


def test_demo_training_on_cuda(tmp_path):
    from torchssvm.cli import main

    assert main(["demo", "--epochs", "1", "--device", "cuda", "--logdir", str(tmp_path)]) == 0
