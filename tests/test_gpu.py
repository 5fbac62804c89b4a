"""CUDA tests: the Triton kernels against their torch twins on the GPU and against the CPU, the hinge loss,
the dual solvers (chains and pictorial structures) and the CLI on CUDA. Skipped without CUDA.

``TORCHSSVM_GPU_TESTS_DEVICE=cpu TRITON_INTERPRET=1 pytest tests/test_gpu.py`` runs the same tests with the
CPU standing in for the GPU (Triton interpreted): a dry run of the tests' own code before a GPU is lent.
``TORCHSSVM_GPU_TESTS_DEVICE=simulated`` runs them on a simulated CUDA device (`simulated_cuda`): the tensors
say ``cuda:0``, so the CUDA-only code paths run, and a CPU tensor meeting a device tensor raises as on a GPU.
"""

import dataclasses
import os

import pytest
import torch
from torchssvm.kernels import mixture_tree_max_sum, spatial_tree_max_sum, tree_max_sum, viterbi_torch

import torchssvm as ts

_REQUESTED = os.environ.get("TORCHSSVM_GPU_TESTS_DEVICE", "cuda")
SIMULATED = _REQUESTED == "simulated"
DEVICE = torch.device("cuda" if SIMULATED else _REQUESTED)
DRY_RUN = DEVICE.type == "cpu" or SIMULATED
GPU_SIZE = pytest.mark.skipif(DRY_RUN, reason="GPU-sized: too slow for the interpreted dry run")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type == "cuda" and not SIMULATED and not torch.cuda.is_available(),
                       reason="needs CUDA"),
    pytest.mark.skipif(DRY_RUN and os.environ.get("TRITON_INTERPRET") != "1",
                       reason="the CPU dry run needs TRITON_INTERPRET=1"),
]


@pytest.fixture(autouse=True)
def _device(monkeypatch):
    """Each test on the simulated device when ``TORCHSSVM_GPU_TESTS_DEVICE=simulated``. There ``backend="auto"``
    picks the torch twins: interpreted Triton is too slow for whole training runs, and the tests that name
    ``backend="triton"`` still run the kernels."""
    if not SIMULATED:
        yield
        return
    from torchssvm.kernels import backends

    from torchssvm.testing import simulated_cuda

    monkeypatch.setattr(backends, "AUTO_TRITON_ON_CUDA", False)
    with simulated_cuda():
        yield


@pytest.mark.parametrize("B,T,K,per_position", [(64, 30, 26, False), (33, 17, 45, True), (8, 12, 300, False),
                                                 pytest.param(4, 6, 1024, False, marks=GPU_SIZE),
                                                 pytest.param(512, 100, 45, False, marks=GPU_SIZE)])
def test_triton_equals_torch_on_cuda(B, T, K, per_position):
    from torchssvm.kernels.chain.viterbi_triton import viterbi_triton

    g = torch.Generator().manual_seed(K)
    unary = torch.randint(-3, 4, (B, T, K), generator=g).float().to(DEVICE)
    trans = torch.randint(-3, 4, (B, T - 1, K, K) if per_position else (K, K), generator=g).float().to(DEVICE)
    start, end = torch.randn(K, generator=g).to(DEVICE), torch.randn(K, generator=g).to(DEVICE)
    lengths = torch.randint(1, T + 1, (B,), generator=g).to(DEVICE)
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
    gpu_pot = ts.ChainPotentials(*(None if t is None else t.to(DEVICE).requires_grad_() for t in pot))
    cpu_loss = ts.StructuredHingeLoss(chain)(cpu_pot, y, lengths)
    cpu_loss.backward()
    loss = ts.StructuredHingeLoss(chain)(gpu_pot, y.to(DEVICE), lengths.to(DEVICE))  # auto: Triton on CUDA
    loss.backward()
    assert float(loss) == pytest.approx(float(cpu_loss), rel=1e-5)
    assert torch.allclose(gpu_pot.unary.grad.cpu(), cpu_pot.unary.grad)
    assert torch.allclose(gpu_pot.transition.grad.cpu(), cpu_pot.transition.grad)


@pytest.mark.parametrize("K,T", [(26, 8), (300, 8), (26, 1)])
def test_hinge_and_oracle_near_float32_max_on_cuda_are_guarded_in_their_kernels(K, T):
    """Float32 potentials in [0.87, 0.9] of float32's max on CUDA outside debug mode (the Triton kernels: the
    sequence kernel at K = 26, the GPU-wide one at K = 300; T = 1, which Triton compiles as a constant): every
    partial sum overflows float32, yet the hinge and the loss-augmented value are the CPU's float64 ones to
    float32's rounding of the sums, +-inf where they do not fit, never NaN (docs/reliability.md, "Numerics at the
    dtype's limits")."""
    g = torch.Generator().manual_seed(K + T)
    B = 6
    top = 0.9 * torch.finfo(torch.float32).max
    shapes = ((B, T, K), (K, K), (K,), (K,))
    tensors = [(top * (1 - torch.rand(*s, generator=g, dtype=torch.float64) / 30)).float().double() for s in shapes]
    y = torch.randint(0, K, (B, T), generator=g)
    lengths = torch.tensor([T, 1, 3, T, 5, 2]).clamp(max=T)
    chain = ts.Chain(K)
    ref = ts.structured_hinge_loss(chain, ts.ChainPotentials(*tensors), y, lengths, reduction="none", backend="torch")
    _, ref_value = chain.max_oracle(ts.ChainPotentials(*tensors), y, lengths, backend="torch")
    pot = ts.ChainPotentials(*(t.float().to(DEVICE) for t in tensors))
    got = ts.structured_hinge_loss(chain, pot, y.to(DEVICE), lengths.to(DEVICE), reduction="none",
                                   backend="triton").cpu()
    _, value = chain.max_oracle(pot, y.to(DEVICE), lengths.to(DEVICE), backend="triton")
    big = torch.finfo(torch.float32).max
    for out, want in ((got, ref), (value.cpu(), ref_value)):
        assert not bool(out.isnan().any()), out
        fits = want.abs() <= big
        assert torch.equal(out[~fits], want[~fits].sign() * float("inf")), (out, want)
        torch.testing.assert_close(out[fits].double(), want[fits], rtol=0,
                                   atol=64 * torch.finfo(torch.float32).eps * T * 3 * top)
    assert bool((ref.abs() <= big).any())  # some hinges fit: the comparison is not empty


@pytest.mark.skipif(DEVICE.type == "cpu", reason="the CPU reads the values: an OverflowError where one does not fit")
def test_score_partition_crf_slack_and_torch_hinge_near_float32_max_on_cuda_are_guarded():
    """A `Chain`'s other calls on CUDA outside debug mode, at potentials in [0.87, 0.9] of float32's max (K = 26,
    T = 7): `score`, `log_partition`, the CRF loss, the slack-rescaled loss (Triton and torch) and the hinge on the
    torch backend, each at the power of two `device_scaling` finds on the device. Against the CPU's float64 (the
    log-partition at its temperature, exact otherwise): the same to float32's rounding of the sums, +-inf where they
    do not fit, never NaN; the CRF's gradient the CPU's (docs/reliability.md, "Numerics at the dtype's limits")."""
    g = torch.Generator().manual_seed(7)
    B, T, K = 6, 7, 26
    top = 0.9 * torch.finfo(torch.float32).max
    shapes = ((B, T, K), (K, K), (K,), (K,))
    tensors = [(top * (1 - torch.rand(*s, generator=g, dtype=torch.float64) / 30)).float().double() for s in shapes]
    y = torch.randint(0, K, (B, T), generator=g)
    lengths = torch.tensor([T, 1, 3, T, 5, 2])
    chain = ts.Chain(K)
    cpu = ts.ChainPotentials(*tensors)
    want = {"score": chain.score(cpu, y, lengths), "log_partition": chain.log_partition(cpu, lengths),
            "slack": ts.slack_rescaled_hinge_loss(chain, cpu, y, lengths, reduction="none", backend="torch"),
            "hinge": ts.structured_hinge_loss(chain, cpu, y, lengths, reduction="none", backend="torch")}
    leaves = [t.float().to(DEVICE).requires_grad_() for t in tensors]
    pot, d_y, d_len = ts.ChainPotentials(*leaves), y.to(DEVICE), lengths.to(DEVICE)
    crf = ts.crf_negative_log_likelihood(chain, pot, d_y, d_len, reduction="none")
    got = {"score": chain.score(pot, d_y, d_len), "log_partition": chain.log_partition(pot, d_len),
           "slack": ts.slack_rescaled_hinge_loss(chain, pot, d_y, d_len, reduction="none", backend="triton"),
           "slack torch": ts.slack_rescaled_hinge_loss(chain, pot, d_y, d_len, reduction="none", backend="torch"),
           "hinge": ts.structured_hinge_loss(chain, pot, d_y, d_len, reduction="none", backend="torch"),
           "crf": crf}
    want["slack torch"] = want["slack"]
    want["crf"] = want["log_partition"] - want["score"]
    big = torch.finfo(torch.float32).max
    assert bool((want["crf"].abs() <= big).all()) and not bool((want["score"].abs() <= big).all())  # both kinds
    atol = 64 * torch.finfo(torch.float32).eps * T * 3 * top
    for name, out in got.items():
        out, ref = out.detach().cpu().double(), want[name].detach()
        assert not bool(out.isnan().any()), (name, out)
        fits = ref.abs() <= big
        assert torch.equal(out[~fits], ref[~fits].sign() * float("inf")), (name, out, ref)
        torch.testing.assert_close(out[fits], ref[fits], rtol=0, atol=atol * (T if "slack" in name else 1))
    grads = torch.autograd.grad(crf.sum(), leaves)
    cpu_leaves = [t.clone().requires_grad_() for t in tensors]
    want_grads = torch.autograd.grad(ts.crf_negative_log_likelihood(chain, ts.ChainPotentials(*cpu_leaves), y, lengths,
                                                                    reduction="sum"), cpu_leaves)
    for gr, w in zip(grads, want_grads):  # the marginals minus the truth's counts, the CPU's in float64
        torch.testing.assert_close(gr.cpu().double(), w, rtol=0, atol=1e-5)


def test_demo_training_on_cuda(tmp_path):
    from torchssvm.cli import main

    assert main(["demo", "--passes", "1", "--device", DEVICE.type, "--logdir", str(tmp_path)]) == 0


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
        assert mod.main(["--epochs", "1", "--limit", "16" if DRY_RUN else "64", "--root", data, "--device", DEVICE.type,
                         "--logdir", str(tmp_path)])


def test_autocast_on_cuda():
    model = torch.nn.Linear(8, 5).to(DEVICE)
    transition = torch.nn.Parameter(torch.zeros(5, 5, device=DEVICE))
    x = torch.randn(4, 6, 8, device=DEVICE)
    y = torch.randint(0, 5, (4, 6), device=DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        loss = ts.StructuredHingeLoss(ts.Chain(5))(ts.ChainPotentials(model(x), transition), y)
    loss.backward()
    assert transition.grad.dtype == torch.float32 and model.weight.grad is not None


def _bcfw_on(device, ds, steps=0, max_passes=None, **kw):
    """A BCFW run on ``device`` (float64, torch oracle): ``steps`` calls of `step`, or `fit` up to
    ``max_passes``; checked against the gap identity. Returns the solver and its exact gap report."""
    model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device=device)
    s = ts.optim.BCFW(model, ds.to(device), seed=0, backend="torch", **{"host_free": True, **kw})
    for _ in range(steps):
        s.step()
    if max_passes is not None:
        s.fit(max_passes=max_passes)
    g = s.duality_gap()
    assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
    return s, g


def test_bcfw_on_cuda_matches_cpu():
    """Uniform BCFW on CUDA tensors follows the CPU trajectory (the host-free step on both: the same counter-based
    samples, no near-ties; float64 sums in another order) and keeps the gap identity."""
    ds = ts.data.synthetic_chain("train", 40, num_labels=4, num_features=6, seed=0)
    runs = [_bcfw_on(device, ds, 3, lam=0.5, gap_check_every=2)[0].w.cpu() for device in ("cpu", DEVICE.type)]
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-9, atol=1e-9)


def test_bcfw_pairwise_cache_on_cuda_certifies_the_cpu_optimum():
    """Pairwise steps make the two active atoms of a block score equally up to rounding (the exact line
    search zeroes the directional derivative), so CPU and CUDA may pick different, equally valid away atoms
    and their trajectories part. Both must still certify the same optimum: P* <= P <= P* + gap on each, so
    the primal values differ by at most the larger certified gap."""
    ds = ts.data.synthetic_chain("train", 40, num_labels=4, num_features=6, seed=0)
    kw = {"lam": 0.5, "gap_check_every": 2, "sampling": "gap", "step": "pairwise", "cache_size": 4, "batch_size": 8}
    passes = 10 if DRY_RUN else 40  # the interpreted dry run: larger certified gaps, the same bound
    res = [_bcfw_on(device, ds, max_passes=passes, **kw)[1] for device in ("cpu", DEVICE.type)]
    assert abs(res[0]["primal"] - res[1]["primal"]) <= max(res[0]["gap"], res[1]["gap"]) + 1e-12


def test_frank_wolfe_and_the_path_on_cuda_match_cpu():
    """Batch Frank-Wolfe and the regularization path built their step weights on the CPU: a CUDA model raised
    'Expected all tensors to be on the same device'."""
    ds = ts.data.synthetic_chain("train", 10, num_labels=3, num_features=4, max_length=5, dtype=torch.float64)
    reports, ends = [], []
    for device in ("cpu", DEVICE.type):
        model = ts.LinearChainModel(4, 3, dtype=torch.float64, device=device)
        fw = ts.optim.FrankWolfe(model, ds.to(device), lam=0.1, backend="torch")
        reports.append([fw.step() for _ in range(3)][-1])
        model = ts.LinearChainModel(4, 3, dtype=torch.float64, device=device)
        path = ts.optim.regularization_path(model, ds.to(device), epsilon=0.5, lam_min=20.0, backend="torch",
                                            host_free=True)  # the same draws on both devices
        ends.append(path.lams)
    assert abs(reports[0]["gap"] - reports[1]["gap"]) <= 1e-9 * (1 + reports[0]["gap"])
    assert len(ends[0]) == len(ends[1]) > 2 and all(abs(a - b) <= 1e-9 * a for a, b in zip(*ends))


def test_box_qp_newton_on_cuda_equals_cpu():
    from torchssvm.optim.frank_wolfe.box_qp import box_qp, qp_objective

    g = torch.Generator().manual_seed(0)
    for B in (2, 16, 64, 256, 320):  # the host's compiled loop up to 256 blocks (with numba), the device's above
        M = torch.randn(B, B + 8, generator=g, dtype=torch.float64) + torch.randn(1, B + 8, generator=g,
                                                                                   dtype=torch.float64)
        H, c = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64)
        u = torch.rand(B, generator=g, dtype=torch.float64)
        cpu = box_qp(c, H, u)
        gpu = box_qp(c.to(DEVICE), H.to(DEVICE), u.to(DEVICE))
        assert gpu.device.type == DEVICE.type
        f_cpu, f_gpu = float(qp_objective(c, H, cpu)), float(qp_objective(c, H, gpu.cpu()))
        assert abs(f_cpu - f_gpu) <= 1e-10 * (1 + abs(f_cpu))


def test_minibatch_bcfw_on_cuda_matches_cpu():
    """The coordinated mini-batch step (batched oracle, Gram, box QP on the device) on CUDA follows the CPU run
    from the same state: same samples, the QP's optimum on both (to rounding), the gap identity on both. Both
    start from the CPU's state after one pass: at w = 0 every labelling that misses each position ties in the
    loss-augmented oracle, and which one a max returns differs between devices (and between CPUs)."""
    ds = ts.data.synthetic_chain("train", 200, num_labels=5, num_features=8, seed=1)
    cpu, _ = _bcfw_on("cpu", ds, 1, lam=0.1, batch_size=32)
    state, res = cpu.state_dict(), []
    for device in ("cpu", DEVICE.type):
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device=device)
        s = ts.optim.BCFW(model, ds.to(device), lam=0.1, batch_size=32, seed=0, backend="torch", host_free=True)
        s.load_state_dict(state)
        for _ in range(4):
            s.step()
        g = s.duality_gap()
        assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
        assert s.z.device.type == device and s.w.device.type == device
        res.append(g)
    assert abs(res[0]["dual"] - res[1]["dual"]) <= 1e-7 * (1 + abs(res[0]["dual"]))
    assert abs(res[0]["primal"] - res[1]["primal"]) <= max(res[0]["gap"], res[1]["gap"]) + 1e-12


@pytest.mark.parametrize("step", ["fw", "pairwise", "away"])
def test_step_kernels_equal_their_twins_on_cuda(step):
    """The mini-batch step's bookkeeping kernels compiled for the GPU against their torch twins there, at OCR's
    shapes: the end of the step (compiled without fused multiply-adds), the atoms' selection and the corners
    bitwise; the scores of marginals and labellings to rounding. (BCFW's own tests above run the torch twins.)"""
    from torchssvm.kernels import apply_block_step, chain_inner, chain_labels_score, chain_marginals, select_atoms

    g = torch.Generator().manual_seed(7)
    n, B, C, T, K = 500, 64, 10, 14, 26
    f64 = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    idx = torch.randperm(n, generator=g)[:B]
    count = torch.randint(1, C + 1, (n,), generator=g)
    s_slot, away = ((torch.rand(B, generator=g) * count[idx]).long() for _ in range(2))
    upper = torch.rand(B, generator=g, dtype=torch.float64)
    gamma = upper * torch.rand(B, generator=g, dtype=torch.float64)
    gamma[:3] = torch.stack([torch.tensor(0.0, dtype=torch.float64), upper[1], upper[2] + 1.0])  # 0, drop, > bound
    kind = (torch.arange(B) % 2) * 2 if step == "away" else None
    alpha = torch.rand(n, C, generator=g, dtype=torch.float64) * (torch.rand(n, C, generator=g) < 0.7)
    valid = torch.rand(n, generator=g) < 0.9
    m = T * K + K * K + 2 * K
    z, ell, direction, d_ell = f64(n, m), f64(n), f64(B, m), f64(B)
    on = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    ends = {}
    for backend in ("torch", "triton"):
        zz, ee, aa = on(z.clone()), on(ell.clone()), on(alpha.clone())
        apply_block_step(zz, ee, on(idx), on(z[idx]), on(ell[idx]), on(gamma), on(direction), on(d_ell), aa,
                         on(valid), step, on(s_slot), None if step == "fw" else on(away), on(upper), on(kind),
                         backend=backend)
        ends[backend] = [t.cpu() for t in (zz, ee, aa)]
    assert all(torch.equal(a, b) for a, b in zip(ends["torch"], ends["triton"]))
    assert not torch.equal(ends["torch"][0], z)

    lengths = torch.randint(1, T + 1, (B,), generator=g)
    labels = torch.randint(0, K, (B, C, T), generator=g).masked_fill(torch.arange(T) >= lengths.view(B, 1, 1), -1)
    theta = [on(t) for t in (f64(B, T, K), f64(K, K), f64(K), f64(K))]
    for op in (lambda be: chain_inner(*theta, on(direction), backend=be),
               lambda be: chain_labels_score(*theta, on(labels), on(lengths), backend=be)):
        torch.testing.assert_close(op("triton").cpu(), op("torch").cpu(), rtol=1e-12, atol=1e-12)
    corners = [chain_marginals(on(labels[:, 0]), on(lengths), K, on(labels[:, 1]), backend=be).cpu()
               for be in ("torch", "triton")]
    assert torch.equal(*corners)

    a_H = torch.randint(-2, 3, (B, C), generator=g).double() / 8  # small integers: ties, first index wins
    gaps, base = torch.rand(n, generator=g, dtype=torch.float64) / 4, f64(B) / 4
    picks = {}
    for backend in ("torch", "triton"):  # the store's losses and weights: alpha's rows will do
        gp, misses = on(gaps.clone()), on(torch.zeros((), dtype=torch.long))
        out = select_atoms(on(a_H), on(count), on(labels), on(alpha[idx]), on(alpha[idx]), on(idx), on(base),
                           on(ell[idx] / 4), gp, on(labels[:, 0]), on(d_ell.abs()), on(d_ell), n, 0.25, 0.01, misses,
                           step != "fw", backend=backend)
        picks[backend] = [t.cpu() for t in out[:3]] + [gp.cpu(), misses.cpu()] + \
            ([] if out[3] is None else [t.cpu() for t in out[3]])
    assert all(torch.equal(a, b) for a, b in zip(picks["torch"], picks["triton"]))
    assert 0 < int(picks["torch"][4]) < B  # hits and misses both


@pytest.mark.skipif(DRY_RUN, reason="counts the CUDA runtime's waiting calls: a real GPU")
@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("config,per_step", [
    ({"host_free": False}, 1),
    ({"host_free": False, "sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 5}, 3),
    ({"host_free": True, "cuda_graph": False}, 0),
    ({"host_free": True, "cuda_graph": False, "sampling": "gap", "step": "pairwise", "cache_size": 10,
      "gap_check_every": 5}, 0)])
def test_minibatch_bcfw_step_waits_on_a_gpu_as_counted_on_the_simulated_device(config, per_step, backend):
    """The host waits of a mini-batch step that `simulated_cuda` counts (tests/test_simulated_cuda.py) are all
    there are: the CUDA runtime's blocking calls in a profile of two passes, after a warm-up pass."""
    from torchssvm.testing import count_cuda_waits

    ds = ts.data.synthetic_chain("train", 128, num_labels=8, num_features=20, seed=0)
    for B in (16, 64):
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device=DEVICE)
        s = ts.optim.BCFW(model, ds.to(DEVICE), lam=0.01, batch_size=B, seed=0, backend=backend, **config)
        s.step()
        with count_cuda_waits() as waits:
            for _ in range(2):
                s.step()
        assert sum(waits.values()) / 2 == per_step * (128 // B) + 1, (B, dict(waits))


@pytest.mark.skipif(DRY_RUN, reason="CUDA graphs: a real GPU (the simulated device's: tests/test_bcfw_host_free.py)")
@pytest.mark.parametrize("config", [{}, {"sampling": "gap", "step": "pairwise", "cache_size": 3, "gap_check_every": 2},
                                    {"sampling": "gap", "step": "away", "cache_size": 4, "box": (-0.5, 0.5)}])
def test_host_free_step_replayed_as_a_cuda_graph_equals_the_eager_step(config):
    """The host-free step captured once per batch size (and again when the store grows or an exact pass moves the
    cache's floor) and replayed: the same iterates as the eager host-free step, which launches every kernel (the
    same kernels in the same order: bitwise up to atomics' order in the products), with the gap identity."""
    ds = ts.data.synthetic_chain("train", 100, num_labels=6, num_features=10, seed=1)
    runs = []
    for graph in (False, True):
        model = ts.LinearChainModel(10, 6, dtype=torch.float64, device=DEVICE)
        s = ts.optim.BCFW(model, ds.to(DEVICE), lam=0.01, batch_size=16, seed=0, host_free=True,
                          cuda_graph=graph, **config)
        reports = [s.step() for _ in range(5)]
        g = s.duality_gap()
        assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
        runs.append((s.w.cpu(), reports, s.graph_captures, s.cuda_graph))
    (w0, r0, c0, _), (w1, r1, c1, on) = runs
    assert on and c1 >= 2 and c0 == 0  # two sizes: 16 and the pass's last step of 4
    torch.testing.assert_close(w0, w1, rtol=1e-9, atol=1e-12)
    for a, b in zip(r0, r1):
        assert (a["oracle_calls"], a["cache_hits"]) == (b["oracle_calls"], b["cache_hits"])
        assert a["gap"] == pytest.approx(b["gap"], rel=1e-8, abs=1e-12)


def test_train_dual_solver_on_cuda(tmp_path, capsys):
    from torchssvm.cli import main

    argv = ["demo", "--passes", "2", "--block-batch", "64", "--device", DEVICE.type, "--logdir", str(tmp_path)]
    assert main(argv) == 0
    assert "gap" in capsys.readouterr().out


@pytest.mark.parametrize("B,T,K,per_position", [(64, 14, 26, False), (32, 40, 23, True), (8, 80, 45, False)])
def test_slack_triton_equals_torch_on_cuda(B, T, K, per_position):
    from torchssvm.kernels import slack_viterbi

    if DRY_RUN:  # the interpreter runs a program per sequence: the same shapes on 3 sequences
        B = 3
    g = torch.Generator().manual_seed(K)
    unary = torch.randint(-3, 4, (B, T, K), generator=g).float().to(DEVICE)
    trans = torch.randint(-3, 4, (B, T - 1, K, K) if per_position else (K, K), generator=g).float().to(DEVICE)
    start, end = torch.randn(K, generator=g).to(DEVICE), torch.randn(K, generator=g).to(DEVICE)
    lengths = torch.randint(1, T + 1, (B,), generator=g).to(DEVICE)
    target = torch.randint(0, K, (B, T), generator=g).to(DEVICE)
    target[torch.arange(T, device=DEVICE).unsqueeze(0) >= lengths.unsqueeze(1)] = -1
    cost = 1.0 / lengths.float()
    gold = ts.Chain(K).score(ts.ChainPotentials(unary, trans, start, end), target, lengths)
    args = (unary, trans, start, end, lengths, target, cost, gold)
    a = slack_viterbi(*args, backend="torch")
    b = slack_viterbi(*args, backend="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# -- trees: explicit tables, pictorial structures, mixtures --------------------------------------------------
TREE = [-1, 0, 0, 1, 1, 2, 5, 5, 3]  # 9 nodes, depth 4, levels of 1 to 3 edges


def _small_ints(g, *shape, lo=-3, hi=4, dtype=torch.float32):
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _dyadic_weights(g, *shape, dtype=torch.float32):
    """``(*shape, 4)`` deformation weights ``(w_x, w_xx, w_y, w_yy)``: multiples of 1/16 in [-1/8, 1/8] for the
    linear terms, of 1/32 in [1/32, 1/8] for the quadratic ones (> 0: a convex cost)."""
    linear, quadratic = {"lo": -2, "hi": 3}, {"lo": 1, "hi": 5}
    return torch.stack([_small_ints(g, *shape, **linear, dtype=dtype) / 16,
                        _small_ints(g, *shape, **quadratic, dtype=dtype) / 32,
                        _small_ints(g, *shape, **linear, dtype=dtype) / 16,
                        _small_ints(g, *shape, **quadratic, dtype=dtype) / 32], dim=-1)


@pytest.mark.parametrize("K,shared,dtype", [(3, True, torch.float32), (70, False, torch.float32),
                                            (300, True, torch.float64)])
def test_tree_triton_equals_torch_on_cuda(K, shared, dtype):
    """Explicit tables: only additions and maxima, so the Triton kernel on the device, the torch twin on the
    device and the torch twin on the CPU agree bitwise, ties (small integers) and real values alike."""
    g = torch.Generator().manual_seed(K)
    B, V = 2 if DRY_RUN else 16, len(TREE)
    for integer in (True, False):
        def draw(*shape, integer=integer):
            return _small_ints(g, *shape, dtype=dtype) if integer else torch.randn(*shape, generator=g).to(dtype)

        unary = draw(B, V, K)
        pairwise = draw(V - 1, K, K) if shared else draw(B, V - 1, K, K)
        ref = tree_max_sum(unary, pairwise, TREE, backend="torch")
        for backend in ("torch", "triton"):
            out = tree_max_sum(unary.to(DEVICE), pairwise.to(DEVICE), TREE, backend=backend)
            assert out[0].device.type == DEVICE.type
            assert torch.equal(out[0].cpu(), ref[0]) and torch.equal(out[1].cpu(), ref[1]), (backend, integer)


def _pose_potentials(side, B, dtype, *, exact):
    """26-part `synthetic_pose` potentials on ``side x side``: detector maps as unaries (rounded to multiples
    of 1/64 with ``exact``), dyadic deformation weights per example, rest offsets rounded to half-integers. With
    ``exact`` every sum and product is exact in float32, so any order of operations (FMA or not) agrees."""
    from torchssvm.data.pose import POSE_PARENTS
    from torchssvm.structures.tree import SpatialTreePotentials

    d = ts.data.synthetic_pose("train", B, height=side, width=side, num_features=1, seed=side)
    g = torch.Generator().manual_seed(side)
    unary = d.features[:, :, 0].to(dtype)
    if exact:
        unary = (unary * 64).round() / 64
    weights = _dyadic_weights(g, B, len(POSE_PARENTS) - 1, dtype=dtype)
    rest = ((d.rest * 2).round() / 2).to(dtype)
    return ts.SpatialTree(POSE_PARENTS, side, side), SpatialTreePotentials(unary, weights, rest), d


def _to(pot, device_or_dtype):
    return type(pot)(*(None if t is None else t.to(device_or_dtype) for t in pot))


@pytest.mark.parametrize("side", [8, pytest.param(32, marks=GPU_SIZE)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spatial_tree_triton_equals_torch_on_cuda(side, dtype):
    """Distance transforms on the 26-part tree, exact (dyadic) potentials: the Triton kernels on the device,
    the torch twin on the device and on the CPU give the same positions and values, ties included."""
    tree, pot, _ = _pose_potentials(side, 2 if DRY_RUN else 8, dtype, exact=True)
    args = (tree.parents, side, side)
    ref = spatial_tree_max_sum(pot.unary, pot.weights, pot.rest, *args, backend="torch")
    dev = _to(pot, DEVICE)
    for backend in ("torch", "triton"):
        out = spatial_tree_max_sum(dev.unary, dev.weights, dev.rest, *args, backend=backend)
        assert torch.equal(out[0].cpu(), ref[0]) and torch.equal(out[1].cpu(), ref[1]), backend


def test_spatial_tree_real_valued_float32_on_cuda_is_optimal():
    """Real-valued float32 maps: the device may round differently (fused multiply-adds), so the check is on
    optimality: the value is the CPU's float64 optimum to float32 rounding, and the returned positions score
    it in float64."""
    tree, pot, _ = _pose_potentials(8 if DRY_RUN else 32, 2 if DRY_RUN else 8, torch.float32, exact=False)
    pot64 = _to(pot, torch.float64)
    best = tree.max_oracle(pot64, backend="torch")
    pos, value = tree.max_oracle(_to(pot, DEVICE), backend="triton")
    exact = tree.score(pot64, pos.cpu())
    torch.testing.assert_close(value.cpu().double(), best[1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(exact, best[1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cooccurrence", [False, True])
def test_mixture_tree_triton_equals_torch_on_cuda(cooccurrence):
    """T = 3 deformation types per edge with type scores at both ends (and co-occurrence of consecutive
    edges' types), exact dyadic potentials on 12 x 12 (4 x 5 in the dry run): device Triton = device torch =
    CPU torch."""
    from torchssvm.data.pose import POSE_PARENTS

    g = torch.Generator().manual_seed(5)
    B, V, H, W, T = (1, len(POSE_PARENTS), 4, 5, 3) if DRY_RUN else (4, len(POSE_PARENTS), 12, 12, 3)
    E, K = V - 1, H * W
    unary = _small_ints(g, B, V, K)
    weights = _dyadic_weights(g, B, E, T)
    rest = _small_ints(g, E, T, 2) / 2
    child, parent = _small_ints(g, B, E, T, K), _small_ints(g, B, E, T, 1)
    cooc = _small_ints(g, E, T, T) / 4 if cooccurrence else None
    tensors = (unary, weights, rest, child, parent, cooc)
    ref = mixture_tree_max_sum(*tensors[:3], POSE_PARENTS, H, W, *tensors[3:], backend="torch")
    dev = [None if t is None else t.to(DEVICE) for t in tensors]
    for backend in ("torch", "triton"):
        out = mixture_tree_max_sum(*dev[:3], POSE_PARENTS, H, W, *dev[3:], backend=backend)
        for a, b in zip(out, ref):
            assert torch.equal(a.cpu(), b), backend


def test_spatial_tree_loss_augmented_on_cuda_is_optimal():
    """The BCFW oracle (unary + truncated LSP loss) with the default backend on the device (Triton on CUDA),
    float64, real-valued maps: its value is the CPU's optimum, and the returned positions attain it
    (score + loss in float64). The loss table (a division by V) is not dyadic, so the check is on the value."""
    tree, pot, d = _pose_potentials(8 if DRY_RUN else 16, 2 if DRY_RUN else 8, torch.float64, exact=False)
    ref = tree.max_oracle(pot, d.positions, d.scale)
    pos, value = tree.max_oracle(_to(pot, DEVICE), d.positions.to(DEVICE), d.scale.to(DEVICE))
    attained = tree.score(pot, pos.cpu()) + tree.task_loss(pos.cpu(), d.positions, d.scale)
    torch.testing.assert_close(value.cpu(), ref[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attained, ref[1], rtol=1e-12, atol=1e-12)


def test_pose_bcfw_with_positivity_box_on_cuda_matches_cpu():
    """`SpatialTreeProblem` on device tensors: BCFW with the positivity box follows the CPU run (same samples,
    unique maximizers with real-valued maps), keeps w_xx, w_yy >= 0 and the gap identity."""
    from torchssvm.optim import BCFW, SpatialTreeProblem

    train = ts.data.synthetic_pose("train", 6, height=10, width=10, seed=0)
    res = []
    for device in ("cpu", DEVICE.type):
        ds = dataclasses.replace(train, features=train.features.to(device), positions=train.positions.to(device))
        p = SpatialTreeProblem(ds)
        s = BCFW(p, lam=0.1, box=p.positivity_box(), seed=0, gap_check_every=1, batch_size=3, host_free=True)
        for _ in range(3):
            s.step()
            assert (p.weights(s.w)[1][:, 1::2] >= 0).all()
        g = s.duality_gap()
        assert s.w.device.type == device and abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9
        res.append((s.w.cpu(), g))
    torch.testing.assert_close(res[0][0], res[1][0], rtol=1e-9, atol=1e-9)
    assert abs(res[0][1]["dual"] - res[1][1]["dual"]) <= 1e-9 * (1 + abs(res[0][1]["dual"]))


@pytest.mark.parametrize("types", [1, 2])
def test_train_pose_on_cuda(tmp_path, capsys, types):
    from torchssvm.cli import main

    test, grid = ("2", "8") if DRY_RUN else ("4", "12")  # the interpreted dry run: the same code on a smaller board
    argv = ["train", "--data", "pose", "--num-train", "8", "--num-test", test, "--grid", grid, "--passes", "2",
            "--types", str(types), "--device", DEVICE.type, "--logdir", str(tmp_path)]
    assert main(argv + (["--limb-modes", "3"] if types > 1 else [])) == 0
    assert "gap" in capsys.readouterr().out
