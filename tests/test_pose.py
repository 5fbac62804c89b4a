"""Pose-like pictorial structures end to end: the `synthetic_pose` generator, `SpatialTreeProblem` against
the `DualProblem` contract (brute force on a small tree), BCFW with the positivity box of note 001
section 2.7 (feasible along training, exact gap identity) and ``torchssvm train --data pose``."""

import glob
import itertools
import math
import re
from types import SimpleNamespace

import pytest
import torch
from torchssvm.kernels import tree_schedule

import torchssvm as ts
from torchssvm.cli import main
from torchssvm.data.pose import LSP_JOINTS, POSE_NODES, POSE_PARENTS, SCALE_NODES
from torchssvm.optim import BCFW, SpatialTreeProblem
from torchssvm.structures.tree import SpatialTreePotentials

F64 = torch.float64


@pytest.fixture(scope="module")
def tiny():
    """4 training and 8 test poses on an 8 x 8 board (V = 26, F = 2, d = 26 * 2 + 25 * 4 = 152)."""
    return (ts.data.synthetic_pose("train", 4, height=8, width=8, seed=0),
            ts.data.synthetic_pose("test", 8, height=8, width=8, seed=0))


def random_w(problem, seed=0, quad_scale=0.3):
    """A random ``w`` with non-negative quadratic deformation weights (the oracle's domain)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(problem.d, generator=g, dtype=F64)
    wp = problem.weights(w)[1]
    wp[:, 1::2] = quad_scale * torch.rand(problem.E, 2, generator=g, dtype=F64)
    return w


def random_labels(problem, B, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(problem.structure.num_labels, (B, C, problem.V), generator=g)


# -- the generator ------------------------------------------------------------------------------------


def test_synthetic_pose_shapes_tree_and_ground_truth():
    ds = ts.data.synthetic_pose("train", 6, height=16, width=12, seed=3)
    n, V, E = 6, 26, 25
    assert len(ds) == n and ds.num_nodes == V and ds.num_features == 2
    assert ds.parents == POSE_PARENTS and ds.names == POSE_NODES and set(LSP_JOINTS) <= set(POSE_NODES)
    sched = tree_schedule(ds.parents)  # validates: one root, no cycle
    assert ds.names[sched.root] == "neck" and len(sched.levels) >= 6  # limbs are chains of several parts
    assert all(p < v for v, p in enumerate(ds.parents) if p >= 0)
    assert ds.features.shape == (n, V, 2, 16 * 12) and ds.features.dtype == torch.float32
    assert torch.isfinite(ds.features).all()
    assert ds.positions.shape == (n, V) and ds.positions.dtype == torch.long
    assert int(ds.positions.min()) >= 0 and int(ds.positions.max()) < 16 * 12
    xy = ds.xy()
    assert (xy[..., 0] < 12).all() and (xy[..., 1] < 16).all()
    # rest offsets: the mean displacement of each edge's child (node e + 1) from its parent
    par = torch.tensor(ds.parents[1:])
    assert ds.rest.shape == (E, 2) and ds.rest.dtype == F64
    torch.testing.assert_close(ds.rest, (xy[:, 1:] - xy[:, par]).double().mean(0))
    a, b = (POSE_NODES.index(s) for s in SCALE_NODES)
    torch.testing.assert_close(ds.scale, (xy[:, a] - xy[:, b]).double().norm(dim=1).clamp_min(1.0))
    # an upright body: head above the neck, ankles below the hips
    assert (ds.rest[POSE_NODES.index("head_top") - 1, 1] < 0) and (ds.rest[POSE_NODES.index("r_ankle") - 1, 1] > 0)
    # the sharp detector peaks at or next to the truth for most parts, but not always (clutter, misses)
    peak = ds.features[:, :, 0].argmax(2)
    px, py = peak % 12, peak // 12
    near = ((px - xy[..., 0]).abs() <= 1) & ((py - xy[..., 1]).abs() <= 1)
    assert 0.4 < float(near.double().mean()) < 1.0
    assert "pose-train" in repr(ds)


def test_synthetic_pose_is_seeded_and_splits_differ():
    a = ts.data.synthetic_pose("train", 3, height=8, width=8, seed=1)
    b = ts.data.synthetic_pose("train", 3, height=8, width=8, seed=1)
    assert torch.equal(a.features, b.features) and torch.equal(a.positions, b.positions)
    assert torch.equal(a.rest, b.rest) and torch.equal(a.scale, b.scale)
    test = ts.data.synthetic_pose("test", 3, height=8, width=8, seed=1)
    other = ts.data.synthetic_pose("train", 3, height=8, width=8, seed=2)
    assert not torch.equal(a.positions, test.positions) and not torch.equal(a.features, test.features)
    assert not torch.equal(a.features, other.features)
    wide = ts.data.synthetic_pose("train", 3, height=8, width=8, seed=1, dtype=F64)
    assert torch.equal(wide.features.float(), a.features)  # drawn in float64, then cast
    one = ts.data.synthetic_pose("train", 3, height=8, width=8, seed=1, num_features=1)
    assert one.features.shape[2] == 1 and torch.equal(one.positions, a.positions)


@pytest.mark.parametrize("kwargs,match", [
    (dict(split="val"), "split"), (dict(n=0), "n"), (dict(height=4), "height"), (dict(width=2.5), "width"),
    (dict(num_features=3), "num_features"), (dict(jitter=-0.1), "jitter"), (dict(size_range=(0.9, 0.5)),
                                                                           r"size_range\[1\]"),
    (dict(size_range=0.5), "size_range"), (dict(clutter=-1), "clutter"), (dict(miss_rate=2.0), "miss_rate"),
    (dict(swap_rate=math.nan), "swap_rate"), (dict(noise="x"), "noise"), (dict(seed=-1), "seed"),
    (dict(dtype=torch.long), "dtype"),
])
def test_synthetic_pose_errors_name_the_argument(kwargs, match):
    args = {"split": "train", "n": 2, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        ts.data.synthetic_pose(args.pop("split"), args.pop("n"), **args)


# -- the problem against the DualProblem contract ----------------------------------------------------


def test_problem_layout_and_the_linear_identities(tiny):
    train, _ = tiny
    p = SpatialTreeProblem(train)
    V, E, F = 26, 25, 2
    assert (p.n, p.d, p.m, p.label_width) == (4, V * F + 4 * E, V * F + 4 * E, V)
    assert p.parameter_slices() == {"unary": (0, V * F, (V, F)), "deformation": (V * F, p.d, (E, 4))}
    w = random_w(p)
    idx = torch.tensor([2, 0, 3])
    theta = p.potentials(w, idx)
    pot = theta.potentials
    # the structure's potentials: unary[v, l] = sum_f w_U[v, f] x[v, f, l], rest = dataset.rest, weights = w_P
    # in pixel units (displacements measured in u = the mean scale s)
    wu, wp = p.weights(w)
    torch.testing.assert_close(pot.unary, (train.features[idx].double() * wu.view(1, V, F, 1)).sum(2))
    u = float(train.scale.mean())
    assert p.unit == u
    torch.testing.assert_close(pot.weights, wp / torch.tensor([u, u * u, u, u * u], dtype=F64), rtol=1e-15, atol=0)
    assert torch.equal(pot.rest, train.rest)
    labels = random_labels(p, 3, 5, seed=1)
    labels[:, 0] = p.truth[idx]
    st = p.structure
    # labels_score == the structure's score == <w, phi(x_i, y)>
    flat = labels.reshape(15, V)
    rep = SpatialTreePotentials(pot.unary.repeat_interleave(5, 0), pot.weights, pot.rest)
    score = st.score(rep, flat).view(3, 5)
    torch.testing.assert_close(p.labels_score(theta, idx, labels), score, rtol=0, atol=1e-12)
    phi = p.joint_features(idx.repeat_interleave(5), flat)
    torch.testing.assert_close(phi @ w, score.reshape(-1), rtol=0, atol=1e-12)
    # corners: <theta_i, corner(y)> = <w, phi(y_i) - phi(y)> = s(y_i) - s(y); zero at the truth
    for c in range(5):
        z = p.corner(idx, labels[:, c])
        torch.testing.assert_close(p.inner(theta, z), score[:, 0] - score[:, c], rtol=0, atol=1e-12)
    assert torch.equal(p.corner(idx, p.truth[idx]), torch.zeros(3, p.d, dtype=F64))
    # task losses: the structure's LSP loss with the dataset's scale; 0 at the truth; max_loss bounds them
    loss = p.task_loss(idx, labels)
    torch.testing.assert_close(loss.reshape(-1), st.task_loss(flat, p.truth[idx].repeat_interleave(5, 0),
                                                              train.scale[idx].repeat_interleave(5)))
    assert (loss[:, 0] == 0).all() and (loss <= p.max_loss(idx).unsqueeze(1) + 1e-12).all()
    assert (p.max_loss(idx) <= 1 + 1e-12).all() and (p.max_loss(idx) > 0.5).all()
    # Gram, sqnorm and accumulate in feature space
    z = torch.stack([p.corner(idx, labels[:, c]) for c in (1, 2)]).mean(0)
    torch.testing.assert_close(p.gram(idx, z), z @ z.T)
    torch.testing.assert_close(p.sqnorm(idx, z), (z * z).sum(1))
    acc = torch.zeros(p.d, dtype=F64)
    coef = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    p.accumulate(acc, idx, z, coef)
    torch.testing.assert_close(acc, (coef.unsqueeze(1) * z).sum(0))
    assert BCFW(p, lam=0.1).problem is p  # make_problem passes a DualProblem through


def brute_force_oracle(ds, w, i):
    """``max_y L_i(y) + <w, phi(x_i, y)> - <w, phi(x_i, y_i)>`` over every labelling, by the formulas
    (displacements in the unit u = mean scale)."""
    V, HW, W = len(ds.parents), ds.height * ds.width, ds.width
    u = float(ds.scale.mean())
    F = ds.features.shape[2]
    wu, wp = w[: V * F].view(V, F), w[V * F:].view(V - 1, 4)
    children = [v for v in range(V) if ds.parents[v] >= 0]

    def score(y):
        s = sum(float(wu[v] @ ds.features[i, v, :, y[v]].double()) for v in range(V))
        for e, c in enumerate(children):
            p = ds.parents[c]
            dx = ((y[c] % W - y[p] % W) - float(ds.rest[e, 0])) / u
            dy = ((y[c] // W - y[p] // W) - float(ds.rest[e, 1])) / u
            s -= float(wp[e] @ torch.tensor([dx, dx * dx, dy, dy * dy], dtype=F64))
        return s

    def loss(y):
        t = ds.positions[i].tolist()
        s2 = float(ds.scale[i]) ** 2
        return sum(min(1.0, ((y[v] % W - t[v] % W) ** 2 + (y[v] // W - t[v] // W) ** 2) / s2) for v in range(V)) / V

    truth = score(ds.positions[i].tolist())
    return max(loss(y) + score(y) - truth for y in itertools.product(range(HW), repeat=V))


def test_oracle_equals_brute_force_on_a_small_tree():
    g = torch.Generator().manual_seed(5)
    n, H, W = 3, 3, 3
    ds = SimpleNamespace(parents=(-1, 0, 0), height=H, width=W,
                         features=torch.randn(n, 3, 2, H * W, generator=g, dtype=F64),
                         positions=torch.randint(H * W, (n, 3), generator=g),
                         rest=torch.randn(2, 2, generator=g, dtype=F64),
                         scale=1 + 2 * torch.rand(n, generator=g, dtype=F64))
    p = SpatialTreeProblem(ds)
    for seed in range(2):
        w = random_w(p, seed=seed, quad_scale=0.5)
        idx = torch.arange(n)
        theta = p.potentials(w, idx)
        labels, loss, H_val = p.oracle(theta, idx)
        for i in range(n):
            assert H_val[i] == pytest.approx(brute_force_oracle(ds, w, i), abs=1e-10)
        # the returned labelling attains the value, with its own loss
        torch.testing.assert_close(loss, p.task_loss(idx, labels.unsqueeze(1)).squeeze(1))
        attained = loss + p.labels_score(theta, idx, labels.unsqueeze(1)).squeeze(1) - \
            p.labels_score(theta, idx, p.truth.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(attained, H_val, rtol=0, atol=1e-10)


def test_oracle_on_the_pose_tree_beats_truth_random_and_single_node_moves(tiny):
    train, _ = tiny
    p = SpatialTreeProblem(train)
    idx = torch.arange(p.n)
    HW = p.structure.num_labels
    for seed in range(2):
        w = random_w(p, seed=10 + seed)
        theta = p.potentials(w, idx)
        labels, loss, H_val = p.oracle(theta, idx)
        s_truth = p.labels_score(theta, idx, p.truth.unsqueeze(1)).squeeze(1)

        def H_of(cand, theta=theta, s_truth=s_truth):  # (B, C, V) -> H_i of each candidate, explicitly
            return p.task_loss(idx, cand) + p.labels_score(theta, idx, cand) - s_truth.unsqueeze(1)

        torch.testing.assert_close(H_of(labels.unsqueeze(1)).squeeze(1), H_val, rtol=0, atol=1e-10)
        torch.testing.assert_close(loss, p.task_loss(idx, labels.unsqueeze(1)).squeeze(1))
        assert (H_val >= -1e-12).all()  # the truth has H = 0
        assert (H_of(random_labels(p, p.n, 64, seed=seed)) <= H_val.unsqueeze(1) + 1e-10).all()
        # no labelling one node away (every node, every position) does better
        moves = labels.unsqueeze(1).repeat(1, p.V * HW, 1).view(p.n, p.V, HW, p.V)
        nodes = torch.arange(p.V)
        moves[:, nodes, :, nodes] = torch.arange(HW).expand(p.n, p.V, HW).permute(1, 0, 2)
        assert (H_of(moves.view(p.n, p.V * HW, p.V)) <= H_val.unsqueeze(1) + 1e-10).all()
        # decode = the MAP labelling: no single-node move improves the plain score either
        y = p.decode(theta, idx)
        best = p.labels_score(theta, idx, y.unsqueeze(1))
        moves = y.unsqueeze(1).repeat(1, p.V * HW, 1).view(p.n, p.V, HW, p.V)
        moves[:, nodes, :, nodes] = torch.arange(HW).expand(p.n, p.V, HW).permute(1, 0, 2)
        assert (p.labels_score(theta, idx, moves.view(p.n, p.V * HW, p.V)) <= best + 1e-10).all()


# -- BCFW with the positivity box -----------------------------------------------------------------------


def quadratic(problem, w):
    return problem.weights(w)[1][:, 1::2]


def test_bcfw_with_positivity_box_is_feasible_along_training_and_certified(tiny):
    train, test = tiny
    p = SpatialTreeProblem(train)
    box = p.positivity_box()
    lower = box["deformation"][0].view(p.E, 4)
    assert (lower[:, 1::2] == 0).all() and torch.isinf(lower[:, 0::2]).all()
    lam, n = 0.1, p.n
    full_lower = torch.cat([torch.full((p.V * p.F,), -math.inf, dtype=F64), box["deformation"][0]])
    s = BCFW(p, lam=lam, box=box, seed=0, gap_check_every=1)
    init_test = p.evaluate(s.w, test)["lsp_loss"]
    first = s.duality_gap()["gap"]
    active, gaps = 0, []
    for _ in range(4):
        r = s.step()
        g = s.duality_gap()
        assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9 and g["gap"] >= -1e-12
        assert r["gap_exact"] and r["gap"] == pytest.approx(g["gap"], abs=1e-12)
        gaps.append(g["gap"])
        # v = sum_i w_i with w_i = z_i / (lam n) (Phi_i is the identity in feature space)
        torch.testing.assert_close(s.v, s.z.sum(0) / (lam * n), rtol=0, atol=1e-12)
        for _ in range(n):  # block by block: w = clip(v) stays in the box after every update
            s._update(s._sample(1))
            assert (quadratic(p, s.w) >= 0).all()
            torch.testing.assert_close(s.w, torch.maximum(s.v, full_lower), rtol=0, atol=0)
            active += int((s.v != s.w).any())
    assert active > 0  # the box was active: without it the oracle would have been called at w_quad < 0
    assert gaps[-1] < 0.6 * first and min(gaps) < 0.5 * first
    assert (quadratic(p, p.weight) >= 0).all()  # the model written by the solver
    trained = p.evaluate(s.w, test)
    assert trained["lsp_loss"] < 0.5 * init_test and trained["pck"] > 0.5
    # better than the independent detectors (each part at the argmax of its sharp score map)
    xy = test.xy()
    peak = test.features[:, :, 0].argmax(2)
    d2 = ((peak % 8 - xy[..., 0]) ** 2 + (peak // 8 - xy[..., 1]) ** 2).double()
    detector = float((d2 / test.scale.unsqueeze(1) ** 2).clamp_max(1).mean())
    assert trained["lsp_loss"] < detector


def test_without_the_box_quadratic_weights_go_negative_and_the_oracle_refuses(tiny):
    train, _ = tiny
    p = SpatialTreeProblem(train)
    s = BCFW(p, lam=0.1, seed=0, gap_check_every=0)
    with pytest.raises(ValueError, match=r"w_xx.*>= 0.*positivity_box"):
        for _ in range(3 * p.n):
            s._update(s._sample(1))
    assert (quadratic(p, s.w) < 0).any()
    theta = p.potentials(s.w, torch.arange(p.n))
    with pytest.raises(ValueError, match="quadratic deformation weights"):
        p.decode(theta, torch.arange(p.n))
    with pytest.raises(ValueError, match="quadratic deformation weights"):
        p.evaluate(s.w)


def test_problem_rejects_bad_datasets(tiny):
    train, _ = tiny
    with pytest.raises(TypeError, match="PoseDataset"):
        SpatialTreeProblem(object())
    bad = SimpleNamespace(**{**vars(train), "positions": train.positions + 1000})
    with pytest.raises(ValueError, match="positions"):
        SpatialTreeProblem(bad)
    with pytest.raises(ValueError, match="rest"):
        SpatialTreeProblem(train, rest=torch.zeros(3, 2))
    bad = SimpleNamespace(**{**vars(train), "scale": -train.scale})
    with pytest.raises(ValueError, match="scale"):
        SpatialTreeProblem(bad)
    bad = SimpleNamespace(**{**vars(train), "features": train.features[:, :, :, :10]})
    with pytest.raises(ValueError, match="features"):
        SpatialTreeProblem(bad)


def test_evaluate_checks_the_test_set_and_reports_the_lsp_loss_for_any_training_loss(tiny):
    """`evaluate` on another data set checks what the constructor checks (it used to score positions out of the
    grid, a scale <= 0 or NaN features), and reports the truncated LSP loss also for a problem trained with the
    Hamming loss (it reported the Hamming loss under the name "lsp_loss")."""
    train, test = tiny
    p = SpatialTreeProblem(train)
    w = random_w(p, seed=2)
    nan = test.features.clone()
    nan[0, 0, 0, 0] = math.nan
    for attr, value, match in (("positions", test.positions + 1000, "positions outside"),
                               ("positions", test.positions.double(), "integer tensor"),
                               ("scale", -test.scale, "scale must be"), ("scale", test.scale * math.nan, "scale"),
                               ("features", nan, "NaN"), ("features", test.features[:, :, :1], "features per node")):
        with pytest.raises(ValueError, match=match):
            p.evaluate(w, SimpleNamespace(**{**vars(test), attr: value}))
    r = p.evaluate(w, test)
    y = p.structure.decode(p._pot(w, test.features.double()))
    (x1, y1), (x0, y0) = p.structure.xy(y), p.structure.xy(test.positions)
    sq = ((x1 - x0) ** 2 + (y1 - y0) ** 2).double()
    assert r["lsp_loss"] == pytest.approx(float((sq / test.scale.double()[:, None] ** 2).clamp_max(1).mean()))
    hamming = SpatialTreeProblem(train, loss="hamming", unit=p.unit)  # the same w decodes alike
    assert hamming.evaluate(w, test) == r
    with pytest.raises(ValueError, match="evaluate\\(w, dataset\\)"):
        hamming.evaluate(w)


# -- the command line -----------------------------------------------------------------------------------


def test_cli_train_pose_runs_bcfw_with_the_box_and_logs(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    argv = ["train", "--data", "pose", "--num-train", "4", "--num-test", "4", "--grid", "8", "--passes", "3",
            "--lam", "0.1", "--logdir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "w_xx, w_yy >= 0" in out and "TensorBoard logs" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("pass")]
    assert len(lines) == 3 and all("test LSP loss" in ln and "primal" in ln and "dual" in ln for ln in lines)
    gaps = [float(ln.split("gap ")[1].split()[0]) for ln in lines]
    assert 0 <= gaps[-1] < gaps[0]
    assert all(float(ln.split("min w_quad ")[1].split()[0]) >= 0 for ln in lines)
    (path,) = glob.glob(f"{tmp_path}/*")
    acc = EventAccumulator(path)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("certificate/duality_gap", "test/lsp_loss", "train/pck", "box/min_quadratic_weight"):
        assert len(acc.Scalars(tag)) == 3
    assert "bcfw/dual" in tags and "bcfw/oracle_calls" in tags
    with pytest.raises(SystemExit) as exit_:  # a usage error: exit 2, the flag named on stderr
        main(["train", "--data", "pose", "--num-train", "0", "--logdir", ""])
    assert exit_.value.code == 2 and re.search('--num-train must be >= 1', capsys.readouterr().err)


def test_cli_train_pose_with_the_hinge_loss_projects_onto_the_box(capsys):
    argv = ["train", "--data", "pose", "--solver", "torch", "--num-train", "4", "--num-test", "4", "--grid", "8",
            "--epochs", "3", "--batch-size", "2", "--lr", "0.05", "--lam", "1e-3", "--logdir", ""]
    assert main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")]
    assert len(lines) == 3
    objective = [float(ln.split("objective ")[1].split()[0]) for ln in lines]
    test_loss = [float(ln.split("test LSP loss ")[1].split()[0]) for ln in lines]
    assert objective[-1] < objective[0] and test_loss[-1] < 0.5  # w = 0 decodes every part at 0: about 1
    assert all(float(ln.split("min w_quad ")[1].split()[0]) >= 0 for ln in lines)


def test_hamming_loss_variant_and_the_unit_argument(tiny):
    train, _ = tiny
    p = SpatialTreeProblem(train, loss="hamming", unit=2.0)
    assert p.unit == 2.0 and p.scale is None
    idx = torch.arange(p.n)
    labels, loss, H_val = p.oracle(p.potentials(random_w(p, seed=4), idx), idx)
    torch.testing.assert_close(loss, (labels != p.truth).double().mean(1))
    assert (H_val >= -1e-12).all()
    assert torch.equal(p.max_loss(idx), torch.ones(p.n, dtype=F64))
    for bad in (0.0, -1.0, math.inf, "2"):
        with pytest.raises(ValueError, match="unit"):
            SpatialTreeProblem(train, unit=bad)


def test_tree_problems_on_a_hamming_dataset_without_scale_and_on_a_single_node():
    """loss='hamming' required a scale it never reads; a one-node tree (no edges) crashed the mixture problem in
    min() of an empty tensor."""
    from types import SimpleNamespace

    from torchssvm.data.pose import EdgeTypes
    from torchssvm.optim import MixtureSpatialTreeProblem, SpatialTreeProblem

    f64 = torch.float64
    g = torch.Generator().manual_seed(0)
    ds = SimpleNamespace(parents=(-1, 0), height=2, width=2, features=torch.randn(2, 2, 1, 4, generator=g, dtype=f64),
                         positions=torch.tensor([[0, 1], [2, 3]]), rest=torch.zeros(1, 2, dtype=f64))
    p = SpatialTreeProblem(ds, loss="hamming")
    assert p.primal(torch.zeros(p.d, dtype=f64), 0.1) > 0
    with pytest.raises(TypeError, match="scale"):
        SpatialTreeProblem(ds)  # the truncated LSP loss needs it
    one = SimpleNamespace(parents=(-1,), height=2, width=2, features=torch.randn(2, 1, 1, 4, generator=g, dtype=f64),
                          positions=torch.zeros(2, 1, dtype=torch.long), rest=torch.zeros(0, 2, dtype=f64),
                          scale=torch.ones(2, dtype=f64))
    mix = MixtureSpatialTreeProblem(one, 2, types=EdgeTypes(torch.zeros(0, 2, 2, dtype=f64),
                                                            torch.zeros(2, 0, dtype=torch.long)))
    # at w = 0 every position scores 0: the primal is the mean largest loss, the same with or without types
    single = SpatialTreeProblem(one)
    assert mix.primal(torch.zeros(mix.d, dtype=f64), 0.1) == pytest.approx(
        single.primal(torch.zeros(single.d, dtype=f64), 0.1)) and single.primal(torch.zeros(single.d, dtype=f64),
                                                                                  0.1) > 0
