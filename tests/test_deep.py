"""The hinge loss inside deep models: autocast, torch.compile, DistributedDataParallel, per-position
transitions from the input."""

import os

import pytest
import torch
from torch import nn

import torchssvm as ts


class Tagger(nn.Module):
    def __init__(self, D=8, K=4, hidden=16, per_position=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, hidden), nn.Tanh(), nn.Linear(hidden, K))
        self.transition = nn.Parameter(torch.zeros(K, K))
        self.pair = nn.Linear(2 * D, K * K) if per_position else None
        self.K = K

    def forward(self, x):
        B, T, _ = x.shape
        transition = self.transition
        if self.pair is not None:  # input-dependent transitions (B, T-1, K, K)
            pair = self.pair(torch.cat([x[:, :-1], x[:, 1:]], -1))
            transition = self.transition + pair.view(B, T - 1, self.K, self.K)
        return ts.ChainPotentials(self.net(x), transition)


def data(n=64, seed=0):
    return ts.data.synthetic_chain("train", n, num_labels=4, num_features=8, noise=1.0, seed=seed)[:]


def test_autocast_bfloat16_matches_float32():
    """Under autocast the unary is bfloat16 and the transition float32: the loss decodes in float32 and
    every gradient comes back in its parameter's dtype, close to the float32 run."""
    torch.manual_seed(0)
    model = Tagger()
    with torch.no_grad():
        model.transition.normal_()
    b = data()
    chain = ts.Chain(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pot = model(b.x)
        assert pot.unary.dtype == torch.bfloat16 and pot.transition.dtype == torch.float32
        loss = ts.StructuredHingeLoss(chain)(pot, b.y, b.lengths)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = ts.StructuredHingeLoss(chain)(model(b.x), b.y, b.lengths)
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=0.05)
    for g, p in zip(grads, model.parameters()):
        assert g.dtype == torch.float32
        assert torch.allclose(g, p.grad, rtol=0.1, atol=0.05)


def test_float16_autocast_losses_are_float32_and_take_a_grad_scalers_scale():
    """Under float16 autocast the losses come back in float32, like autocast's own losses: a float16 loss made
    GradScaler's default scale (65536, above float16's largest value) inf in the loss's own backward, whatever the
    gradients' size, and the scaler skipped every step taken at that scale."""
    torch.manual_seed(0)
    B, T, K = 8, 6, 4
    x, y = torch.randn(B, T, 5), torch.randint(0, K, (B, T))
    for loss_fn in (ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss, ts.crf_negative_log_likelihood):
        head, transition = torch.nn.Linear(5, K), torch.nn.Parameter(torch.zeros(K, K))
        with torch.autocast("cpu", dtype=torch.float16):
            unary = head(x)
            unary.retain_grad()
            loss = loss_fn(ts.Chain(K), (unary, transition), y)
        assert unary.dtype == torch.float16 and loss.dtype == torch.float32
        torch.amp.GradScaler("cpu").scale(loss).backward()  # 65536 x the loss
        assert bool(torch.isfinite(unary.grad).all()) and bool(torch.isfinite(transition.grad).all()), loss_fn


@pytest.mark.parametrize("structure", [ts.MultiLabel(8), ts.Hierarchy([-1, 0, 0, 1, 1, 2, -1, 6])])
def test_autocast_leaves_enumeration_oracles_in_float32(structure):
    """MultiLabel and Hierarchy score labellings by matrix products, which autocast would run in bfloat16
    (picking wrong argmaxes): under autocast, float32 potentials give exactly the losses and argmaxes of the
    float32 run, for the margin and slack hinges, the CRF loss and the public oracles."""
    g = torch.Generator().manual_seed(0)
    B, K = 128, structure.num_labels
    if isinstance(structure, ts.MultiLabel):
        pot = ts.MultiLabelPotentials(torch.randn(B, K, generator=g) * 4, torch.randn(structure.num_edges, generator=g))
    else:
        pot = torch.randn(B, K, generator=g) * 4
    y = structure.decode(pot)  # a valid labelling of either structure
    y = torch.where(torch.rand(y.shape, generator=g) < 0.3, 1 - y, y) if isinstance(structure, ts.MultiLabel) else y
    fns = [lambda: ts.structured_hinge_loss(structure, pot, y, reduction="none", return_argmax=True),
           lambda: ts.slack_rescaled_hinge_loss(structure, pot, y, reduction="none", return_argmax=True),
           lambda: (structure.max_oracle(pot, y)[1], structure.max_oracle(pot, y)[0]),
           lambda: (structure.score(pot, y), y)]
    if isinstance(structure, ts.MultiLabel):
        fns.append(lambda: (ts.crf_negative_log_likelihood(structure, pot, y, reduction="none"), y))
    for fn in fns:
        ref_value, ref_label = fn()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            value, label = fn()
        assert value.dtype == torch.float32 and torch.equal(value, ref_value) and torch.equal(label, ref_label)


def test_per_position_transitions_from_the_input_train():
    torch.manual_seed(0)
    model = Tagger(per_position=True)
    b = data(128)
    crit = ts.StructuredHingeLoss(ts.Chain(4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = crit(model(b.x), b.y, b.lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert model.pair.weight.grad.abs().sum() > 0
    assert losses[-1] < 0.5 * losses[0]


def test_torch_compile_of_the_surrounding_model():
    """The network is compiled; the loss stays eager. Same losses and gradients as eager."""
    torch.manual_seed(0)
    model = Tagger()
    compiled = torch.compile(model)
    b = data(32)
    crit = ts.StructuredHingeLoss(ts.Chain(4))
    eager_loss = crit(model(b.x), b.y, b.lengths)
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss = crit(compiled(b.x), b.y, b.lengths)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(eager_loss.detach()), rel=1e-5)
    for g, p in zip(eager_grads, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-5)


def _ddp_worker(rank, world, init_file, steps, out_file):
    import torch.distributed as dist

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = Tagger().double()
        ddp = nn.parallel.DistributedDataParallel(model)
        b = data(64)
        half = 64 // world
        x = b.x[rank * half : (rank + 1) * half].double()
        y, lengths = b.y[rank * half : (rank + 1) * half], b.lengths[rank * half : (rank + 1) * half]
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        crit = ts.StructuredHingeLoss(ts.Chain(4))
        for _ in range(steps):
            loss = crit(ddp(x), y, lengths)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            torch.save([p.detach() for p in model.parameters()], out_file)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_distributed_data_parallel_gloo_equals_single_process(tmp_path):
    """Two CPU processes with DDP (gloo) on halves of the batch follow the single-process full-batch
    trajectory: DDP averages the two half-batch mean gradients."""
    import torch.multiprocessing as mp

    steps = 3
    out = str(tmp_path / "params.pt")
    for attempt in range(3):
        try:  # a fresh rendezvous file per attempt
            mp.spawn(_ddp_worker, args=(2, str(tmp_path / f"init{attempt}"), steps, out), nprocs=2, join=True)
            break
        except mp.ProcessExitedException as e:
            # gloo's threads now and then abort a worker at teardown ("terminate called without an active
            # exception", SIGABRT): an infrastructure flake, retried; any other failure raises
            if e.signal_name != "SIGABRT" or attempt == 2:
                raise
    torch.manual_seed(0)
    model = Tagger().double()
    b = data(64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    crit = ts.StructuredHingeLoss(ts.Chain(4))
    for _ in range(steps):
        loss = crit(model(b.x.double()), b.y, b.lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ddp_params = torch.load(out)
    for p, q in zip(model.parameters(), ddp_params):
        assert torch.allclose(p.detach(), q, atol=1e-10)
    assert any(float(q.abs().sum()) > 0 for q in ddp_params)


@pytest.mark.skipif(os.environ.get("TORCHSSVM_SKIP_EXAMPLES") == "1", reason="examples disabled")
def test_examples_run(data_root, tmp_path):
    """Both deep examples run end to end on a few sequences (one epoch) and report their metrics."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "scripts" / "examples"
    for name, extra in [("ocr_cnn", []), ("conll_bilstm", ["--transition", "per-position"])]:
        spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out = mod.main(["--epochs", "1", "--limit", "40", "--root", data_root, "--device", "cpu",
                        "--logdir", str(tmp_path), "--history", str(tmp_path / f"{name}.json"), *extra])
        assert (tmp_path / f"{name}.json").exists() and out


def test_vmap_over_a_loss_says_it_is_unsupported():
    """The boundary checks read values on the host, which vmap's batched tensors cannot give ("Cannot access data
    pointer of Tensor that doesn't have storage"): a NotImplementedError names vmap instead."""
    y = torch.randint(0, 3, (2, 4))
    for loss_fn in (ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss, ts.crf_negative_log_likelihood):
        with pytest.raises(NotImplementedError, match="vmap"):
            torch.func.vmap(lambda u, fn=loss_fn: fn(ts.Chain(3), (u.unsqueeze(0), torch.zeros(3, 3)), y[:1]))(
                torch.randn(5, 4, 3))
    with pytest.raises(NotImplementedError, match="vmap"):  # over the loss weight
        torch.func.vmap(lambda w: ts.structured_hinge_loss(ts.Chain(3), (torch.zeros(1, 4, 3), torch.zeros(3, 3)),
                                                           y[:1], loss_weight=w))(torch.rand(5))
    chain = ts.Chain(3)  # the structures' checked calls too (decode, score, log_partition)
    for call in (lambda u: chain.decode((u.unsqueeze(0), torch.zeros(3, 3))),
                 lambda u: chain.score((u.unsqueeze(0), torch.zeros(3, 3)), y[:1]),
                 lambda u: chain.log_partition((u.unsqueeze(0), torch.zeros(3, 3))),
                 lambda w: chain.max_oracle((torch.zeros(1, 4, 3), torch.zeros(3, 3)), y[:1], loss_weight=w[0, :1])):
        with pytest.raises(NotImplementedError, match="structures' checked calls.*do not support torch.func.vmap"):
            torch.func.vmap(call)(torch.randn(5, 4, 3))


@pytest.mark.parametrize("backend", ["torch", "numba", "triton"])
def test_torch_func_grad_of_the_hinges_equals_autograd(backend):
    """`torch.func.grad` (meta-learning, functional training loops) through the hinges' autograd Functions, which
    define `setup_context` for it: the same gradient as `torch.autograd.grad`."""
    if backend == "triton":
        pytest.importorskip("triton")
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1")
    g = torch.Generator().manual_seed(5)
    unary, trans = torch.randn(3, 4, 3, generator=g), torch.randn(3, 3, generator=g)
    y, lengths = torch.randint(0, 3, (3, 4), generator=g), torch.tensor([4, 2, 3])
    chain = ts.Chain(3)
    fns = [ts.structured_hinge_loss, ts.slack_rescaled_hinge_loss] if backend != "numba" else [ts.structured_hinge_loss]
    for loss_fn in fns:
        def f(u, loss_fn=loss_fn):
            return loss_fn(chain, (u, trans), y, lengths, backend=backend)

        leaf = unary.clone().requires_grad_()
        (expected,) = torch.autograd.grad(f(leaf), leaf)
        torch.testing.assert_close(torch.func.grad(f)(unary), expected, rtol=0, atol=0)
