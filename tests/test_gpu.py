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
    cpu_pot = ts.ChainPotentials(*(None if t is None else t.clone().requires_grad_() for t in pot))
    gpu_pot = ts.ChainPotentials(*(None if t is None else t.cuda().requires_grad_() for t in pot))
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


def test_deep_examples_on_cuda(tmp_path):
    import importlib.util
    import os
    from pathlib import Path

    data = os.environ.get("TORCHSSVM_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    root = Path(__file__).resolve().parents[1] / "scripts" / "examples"
    for name in ("ocr_cnn", "conll_bilstm"):
        spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.main(["--epochs", "1", "--limit", "64", "--root", data, "--device", "cuda",
                         "--logdir", str(tmp_path)])


def test_autocast_on_cuda():
    model = torch.nn.Linear(8, 5).cuda()
    transition = torch.nn.Parameter(torch.zeros(5, 5, device="cuda"))
    x = torch.randn(4, 6, 8, device="cuda")
    y = torch.randint(0, 5, (4, 6), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = ts.StructuredHingeLoss(ts.Chain(5))(ts.ChainPotentials(model(x), transition), y)
    loss.backward()
    assert transition.grad.dtype == torch.float32 and model.weight.grad is not None


def _bcfw_on(device, ds, steps=0, max_passes=None, **kw):
    """A BCFW run on ``device`` (float64, torch oracle): ``steps`` calls of `step`, or `fit` up to
    ``max_passes``; checked against the gap identity. Returns the solver and its exact gap report."""
    model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device=device)
    s = ts.optim.BCFW(model, ds.to(device), seed=0, backend="torch", **kw)
    for _ in range(steps):
        s.step()
    if max_passes is not None:
        s.fit(max_passes=max_passes)
    g = s.duality_gap()
    assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
    return s, g


def test_bcfw_on_cuda_matches_cpu():
    """Uniform BCFW on CUDA tensors follows the CPU trajectory (same samples, no near-ties; float64 sums in
    another order) and keeps the gap identity."""
    ds = ts.data.synthetic_chain("train", 40, num_labels=4, num_features=6, seed=0)
    runs = [_bcfw_on(device, ds, 3, lam=0.5, gap_check_every=2)[0].w.cpu() for device in ("cpu", "cuda")]
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-9, atol=1e-9)


def test_bcfw_pairwise_cache_on_cuda_certifies_the_cpu_optimum():
    """Pairwise steps make the two active atoms of a block score equally up to rounding (the exact line
    search zeroes the directional derivative), so CPU and CUDA may pick different, equally valid away atoms
    and their trajectories part. Both must still certify the same optimum: P* <= P <= P* + gap on each, so
    the primal values differ by at most the larger certified gap."""
    ds = ts.data.synthetic_chain("train", 40, num_labels=4, num_features=6, seed=0)
    kw = {"lam": 0.5, "gap_check_every": 2, "sampling": "gap", "step": "pairwise", "cache_size": 4, "batch_size": 8}
    res = [_bcfw_on(device, ds, max_passes=40, **kw)[1] for device in ("cpu", "cuda")]
    assert abs(res[0]["primal"] - res[1]["primal"]) <= max(res[0]["gap"], res[1]["gap"]) + 1e-12


def test_box_qp_newton_on_cuda_equals_cpu():
    from torchssvm.optim.box_qp import box_qp, qp_objective

    g = torch.Generator().manual_seed(0)
    for B in (2, 16, 64, 256):
        M = torch.randn(B, B + 8, generator=g, dtype=torch.float64) + torch.randn(1, B + 8, generator=g,
                                                                                   dtype=torch.float64)
        H, c = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        cpu = box_qp(c, H, u)
        gpu = box_qp(c.cuda(), H.cuda(), u.cuda())
        assert gpu.is_cuda
        f_cpu, f_gpu = float(qp_objective(c, H, cpu)), float(qp_objective(c, H, gpu.cpu()))
        assert abs(f_cpu - f_gpu) <= 1e-10 * (1 + abs(f_cpu))


def test_minibatch_bcfw_on_cuda_matches_cpu():
    """The coordinated mini-batch step (batched oracle, Gram, box QP on the device) on CUDA follows the
    CPU run: same samples, the QP's optimum on both (to rounding), the gap identity on both."""
    ds = ts.data.synthetic_chain("train", 200, num_labels=5, num_features=8, seed=1)
    res = []
    for device in ("cpu", "cuda"):
        s, g = _bcfw_on(device, ds, 5, lam=0.1, batch_size=32)
        assert s.z.is_cuda == (device == "cuda") and s.w.is_cuda == (device == "cuda")
        res.append(g)
    assert abs(res[0]["dual"] - res[1]["dual"]) <= 1e-7 * (1 + abs(res[0]["dual"]))
    assert abs(res[0]["primal"] - res[1]["primal"]) <= max(res[0]["gap"], res[1]["gap"]) + 1e-12


def test_train_dual_solver_on_cuda(tmp_path, capsys):
    from torchssvm.cli import main

    assert main(["demo", "--passes", "2", "--block-batch", "64", "--device", "cuda", "--logdir", str(tmp_path)]) == 0
    assert "gap" in capsys.readouterr().out


@pytest.mark.parametrize("B,T,K,per_position", [(64, 14, 26, False), (32, 40, 23, True), (8, 80, 45, False)])
def test_slack_triton_equals_torch_on_cuda(B, T, K, per_position):
    from torchssvm.kernels import slack_viterbi

    g = torch.Generator().manual_seed(K)
    unary = torch.randint(-3, 4, (B, T, K), generator=g).float().cuda()
    trans = torch.randint(-3, 4, (B, T - 1, K, K) if per_position else (K, K), generator=g).float().cuda()
    start, end = torch.randn(K, generator=g).cuda(), torch.randn(K, generator=g).cuda()
    lengths = torch.randint(1, T + 1, (B,), generator=g).cuda()
    target = torch.randint(0, K, (B, T), generator=g).cuda()
    target[torch.arange(T, device="cuda").unsqueeze(0) >= lengths.unsqueeze(1)] = -1
    cost = 1.0 / lengths.float()
    gold = ts.Chain(K).score(ts.ChainPotentials(unary, trans, start, end), target, lengths)
    args = (unary, trans, start, end, lengths, target, cost, gold)
    a = slack_viterbi(*args, backend="torch")
    b = slack_viterbi(*args, backend="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
