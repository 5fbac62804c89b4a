"""Mixture types per edge end to end: articulated `synthetic_pose`, K-means `edge_types`, and
`MixtureSpatialTreeProblem` against the `DualProblem` contract (brute force over positions and types on a
small tree) and under BCFW with the positivity box (feasible along training, exact gap identity)."""

import dataclasses
import itertools
import math
import re
from types import SimpleNamespace

import pytest
import torch

import torchssvm as ts
from torchssvm.data.pose import POSE_NODES
from torchssvm.optim import BCFW, MixtureSpatialTreeProblem
from torchssvm.structures.mixture_tree import MixtureTreePotentials

F64 = torch.float64


@pytest.fixture(scope="module")
def articulated():
    """12 training poses with 3 limb modes on a 12 x 12 board, and 6 test poses."""
    kw = {"height": 12, "width": 12, "limb_modes": 3, "limb_angle": 1.2, "seed": 1}
    return ts.data.synthetic_pose("train", 12, **kw), ts.data.synthetic_pose("test", 6, **kw)


def random_w(problem, seed=0, quad_scale=0.3):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(problem.d, generator=g, dtype=F64)
    problem.weights(w)[-1][..., 1::2] = quad_scale * torch.rand(problem.E, problem.T, 2, generator=g, dtype=F64)
    return w


def random_labels(problem, B, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(problem.structure.num_labels, (B, C, problem.V), generator=g)
    return torch.cat([pos, torch.randint(problem.T, (B, C, problem.E), generator=g)], 2)


def check_scores(p, w, theta, idx, seed):
    """4 labellings per example of ``idx`` (the truth first): `labels_score` equals the structure's score and
    ``<w, phi>``. Returns the labels ``(B, 4, V + E)`` and their scores ``(B, 4)``."""
    B, L = idx.shape[0], p.V + p.E
    labels = random_labels(p, B, 4, seed=seed)
    labels[:, 0] = p.truth[idx]
    flat = labels.reshape(B * 4, L)
    pot = theta.potentials
    rep = MixtureTreePotentials(pot.unary.repeat_interleave(4, 0), pot.weights, pot.rest,
                                pot.child_scores.repeat_interleave(4, 0), None, pot.cooccurrence)
    score = p.structure.score(rep, flat).view(B, 4)
    torch.testing.assert_close(p.labels_score(theta, idx, labels), score, rtol=0, atol=1e-12)
    torch.testing.assert_close(p.joint_features(idx.repeat_interleave(4), flat) @ w, score.reshape(-1),
                               rtol=0, atol=1e-12)
    return labels, score


# -- data ---------------------------------------------------------------------------------------------
def test_limb_modes_bend_only_the_limbs():
    kw = {"n": 40, "height": 48, "width": 48, "seed": 3}
    upright = ts.data.synthetic_pose(**kw)
    bent = ts.data.synthetic_pose(limb_modes=3, limb_angle=1.0, **kw)
    assert torch.equal(upright.features, ts.data.synthetic_pose(limb_modes=1, **kw).features)
    limbs = {POSE_NODES.index(name) for name in POSE_NODES
             if any(part in name for part in ("arm", "elbow", "wrist", "thigh", "knee", "shin", "ankle"))}
    rest = [v for v in range(26) if v not in limbs]
    assert torch.equal(upright.positions[:, rest], bent.positions[:, rest])  # the torso and head stay
    assert (upright.positions[:, sorted(limbs)] != bent.positions[:, sorted(limbs)]).float().mean() > 0.4
    with pytest.raises(ValueError, match="limb_modes must be >= 1"):
        ts.data.synthetic_pose(limb_modes=0)
    with pytest.raises(ValueError, match="limb_angle must be finite"):
        ts.data.synthetic_pose(limb_angle=4.0)


def test_edge_types_are_kmeans_centres_and_nearest_assignments(articulated):
    train, test = articulated
    et = ts.data.edge_types(train, 3, seed=0)
    assert et.rest.shape == (25, 3, 2) and et.types.shape == (12, 25) and et.rest.dtype == F64
    xy = train.xy().double()
    par = torch.tensor(train.parents[1:])
    disp = xy[:, 1:] - xy[:, par]  # (n, E, 2)
    for e in range(25):
        d = torch.cdist(disp[:, e], et.rest[e])
        assert torch.equal(et.types[:, e], d.argmin(1))  # nearest centre
        for t in range(3):  # a Lloyd fixed point: every non-empty cluster's centre is its members' mean
            members = disp[et.types[:, e] == t, e]
            if members.shape[0]:
                torch.testing.assert_close(et.rest[e, t], members.mean(0))
        assert (et.rest[e, 1:, 0] >= et.rest[e, :-1, 0]).all()  # sorted by dx
    assert torch.equal(ts.data.edge_types(train, 3, seed=0).rest, et.rest)  # seeded
    on_test = ts.data.edge_types(test, 3, rest=et.rest)
    assert torch.equal(on_test.rest, et.rest) and on_test.types.shape == (6, 25)
    one = ts.data.edge_types(train, 1)
    torch.testing.assert_close(one.rest[:, 0], train.rest)  # one type: the mean displacement
    with pytest.raises(ValueError, match="num_types = 13 exceeds"):
        ts.data.edge_types(train, 13)
    with pytest.raises(ValueError, match="rest must be a finite"):
        ts.data.edge_types(test, 3, rest=torch.zeros(25, 2, 2))


# -- the problem --------------------------------------------------------------------------------------
def test_problem_layout_and_the_linear_identities(articulated):
    train, _ = articulated
    p = MixtureSpatialTreeProblem(train, 3)
    V, E, F, T = 26, 25, 2, 3
    assert (p.n, p.d, p.label_width) == (12, V * F + E * T + 4 * E * T, V + E)
    assert p.type_scale == pytest.approx(0.2)  # 1 / sqrt(E)
    assert p.parameter_slices() == {"unary": (0, V * F, (V, F)), "type": (V * F, V * F + E * T, (E, T)),
                                    "deformation": (V * F + E * T, p.d, (E, T, 4))}
    assert torch.equal(p.truth[:, V:], ts.data.edge_types(train, 3).types)
    w = random_w(p)
    idx = torch.tensor([5, 0, 11])
    theta = p.potentials(w, idx)
    labels, score = check_scores(p, w, theta, idx, seed=1)
    for c in range(4):
        torch.testing.assert_close(p.inner(theta, p.corner(idx, labels[:, c])), score[:, 0] - score[:, c],
                                   rtol=0, atol=1e-12)
    assert torch.equal(p.corner(idx, p.truth[idx]), torch.zeros(3, p.d, dtype=F64))
    loss = p.task_loss(idx, labels)
    assert (loss[:, 0] == 0).all() and (loss <= p.max_loss(idx).unsqueeze(1) + 1e-12).all()
    bad = w.clone()
    p.weights(bad)[-1][7, 2, 3] = -0.5  # w_yy of edge 7, type 2
    with pytest.raises(ValueError, match=r"quadratic deformation weights.*edges \[7\].*positivity_box"):
        p.decode(p.potentials(bad, idx), idx)
    same_pos = labels[:, :1].clone()
    same_pos[..., V:] = (same_pos[..., V:] + 1) % T  # other types, same positions: no loss
    assert (p.task_loss(idx, same_pos) == 0).all()


def brute_force_oracle(ds, rest, types, w, i, T, scale_t):
    """``max_{l, t} L_i(l) + <w, phi(x_i, (l, t))> - <w, phi(x_i, y_i)>`` by the formulas (unit = mean s, type
    feature scale_t)."""
    V, HW, W = len(ds.parents), ds.height * ds.width, ds.width
    E, u, F = V - 1, float(ds.scale.mean()), ds.features.shape[2]
    wu = w[:V * F].view(V, F)
    wt = w[V * F:V * F + E * T].view(E, T)
    wp = w[V * F + E * T:].view(E, T, 4)
    children = [v for v in range(V) if ds.parents[v] >= 0]

    def score(y, t):
        s = sum(float(wu[v] @ ds.features[i, v, :, y[v]].double()) for v in range(V))
        for e, c in enumerate(children):
            p = ds.parents[c]
            dx = ((y[c] % W - y[p] % W) - float(rest[e, t[e], 0])) / u
            dy = ((y[c] // W - y[p] // W) - float(rest[e, t[e], 1])) / u
            s += scale_t * float(wt[e, t[e]]) - float(wp[e, t[e]] @ torch.tensor([dx, dx * dx, dy, dy * dy], dtype=F64))
        return s

    def loss(y):
        tr = ds.positions[i].tolist()
        s2 = float(ds.scale[i]) ** 2
        return sum(min(1.0, ((y[v] % W - tr[v] % W) ** 2 + (y[v] // W - tr[v] // W) ** 2) / s2) for v in range(V)) / V

    truth = score(ds.positions[i].tolist(), types[i].tolist())
    return max(loss(y) + score(y, t) - truth
               for y in itertools.product(range(HW), repeat=V) for t in itertools.product(range(T), repeat=E))


def test_oracle_equals_brute_force_on_a_small_tree():
    g = torch.Generator().manual_seed(8)
    n, H, W, T = 3, 3, 3, 2
    ds = SimpleNamespace(parents=(-1, 0, 0), height=H, width=W, names=("a", "b", "c"),
                         features=torch.randn(n, 3, 2, H * W, generator=g, dtype=F64),
                         positions=torch.randint(H * W, (n, 3), generator=g),
                         rest=torch.zeros(2, 2, dtype=F64), scale=1 + 2 * torch.rand(n, generator=g, dtype=F64))
    types = ts.data.EdgeTypes(torch.randn(2, T, 2, generator=g, dtype=F64), torch.randint(T, (n, 2), generator=g))
    c = 0.7
    p = MixtureSpatialTreeProblem(ds, T, types=types, type_scale=c)
    idx = torch.arange(n)
    for seed in range(2):
        w = random_w(p, seed=seed, quad_scale=0.5)
        theta = p.potentials(w, idx)
        labels, loss, H_val = p.oracle(theta, idx)
        for i in range(n):
            assert H_val[i] == pytest.approx(brute_force_oracle(ds, types.rest, types.types, w, i, T, c), abs=1e-10)
        attained = loss + p.labels_score(theta, idx, labels.unsqueeze(1)).squeeze(1) - \
            p.labels_score(theta, idx, p.truth.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(attained, H_val, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="types must be an EdgeTypes"):
        MixtureSpatialTreeProblem(ds, 3, types=types)
    with pytest.raises(ValueError, match="type_scale must be a finite number > 0"):
        MixtureSpatialTreeProblem(ds, T, types=types, type_scale=0.0)
    with pytest.raises(ValueError, match=r"types.types must be integers in \[0, 2\)"):
        MixtureSpatialTreeProblem(ds, T, types=ts.data.EdgeTypes(types.rest, types.types + 1))


def test_bcfw_with_positivity_box_is_feasible_and_certified(articulated):
    train, test = articulated
    p = MixtureSpatialTreeProblem(train, 3)
    box = p.positivity_box()
    lower = box["deformation"][0].view(p.E, p.T, 4)
    assert (lower[..., 1::2] == 0).all() and torch.isinf(lower[..., 0::2]).all()
    free = torch.full((p.V * p.F + p.E * p.T,), -math.inf, dtype=F64)
    full_lower = torch.cat([free, box["deformation"][0]])
    s = BCFW(p, lam=0.1, box=box, seed=0, gap_check_every=1)
    first = s.duality_gap()["gap"]
    active = 0
    for _ in range(3):
        r = s.step()
        g = s.duality_gap()
        assert abs(g["primal"] - g["dual"] - g["gap"]) < 1e-9 and g["gap"] >= -1e-12
        assert r["gap_exact"] and r["gap"] == pytest.approx(g["gap"], abs=1e-12)
        for _ in range(p.n):
            s._update(s._sample(1))
            assert (p.weights(s.w)[-1][..., 1::2] >= 0).all()
            torch.testing.assert_close(s.w, torch.maximum(s.v, full_lower), rtol=0, atol=0)
            active += int((s.v != s.w).any())
    assert active > 0 and s.duality_gap()["gap"] < 0.5 * first
    ev = p.evaluate(s.w, test)
    assert ev["pck"] > 0.5  # positions only: the types' rest offsets come from the training set
    y = p.decode(p.potentials(s.w, torch.arange(p.n)), torch.arange(p.n))
    assert y.shape == (p.n, p.V + p.E) and int(y[:, p.V:].max()) < p.T



def test_problem_with_cooccurrence_layout_identities_and_brute_force(articulated):
    train, _ = articulated
    p = MixtureSpatialTreeProblem(train, 2, cooccurrence=True)
    V, E, F, T = 26, 25, 2, 2
    assert p.d == V * F + E * T + E * T * T + 4 * E * T
    assert p.parameter_slices()["cooccurrence"] == (V * F + E * T, V * F + E * T + E * T * T, (E, T, T))
    w = random_w(p, seed=4)
    idx = torch.tensor([3, 9])
    theta = p.potentials(w, idx)
    torch.testing.assert_close(theta.potentials.cooccurrence, p.type_scale * p.weights(w)[3])
    check_scores(p, w, theta, idx, seed=3)
    with pytest.raises(TypeError, match="cooccurrence must be a bool"):
        MixtureSpatialTreeProblem(train, 2, cooccurrence=1)
    with pytest.raises((TypeError, ValueError), match="num_types"):
        MixtureSpatialTreeProblem(train, 2.7)
    # the oracle against enumeration on a small tree: positions and types, co-occurrence included
    g = torch.Generator().manual_seed(11)
    n, H, W = 2, 2, 3
    ds = SimpleNamespace(parents=(-1, 0, 1), height=H, width=W, names=("a", "b", "c"),
                         features=torch.randn(n, 3, 1, H * W, generator=g, dtype=F64),
                         positions=torch.randint(H * W, (n, 3), generator=g),
                         rest=torch.zeros(2, 2, dtype=F64), scale=1 + torch.rand(n, generator=g, dtype=F64))
    types = ts.data.EdgeTypes(torch.randn(2, T, 2, generator=g, dtype=F64), torch.randint(T, (n, 2), generator=g))
    p = MixtureSpatialTreeProblem(ds, T, types=types, cooccurrence=True)
    w = random_w(p, seed=5, quad_scale=0.5)
    idx = torch.arange(n)
    theta = p.potentials(w, idx)
    _, _, H_val = p.oracle(theta, idx)
    labels = torch.tensor([list(y) + list(t) for y in itertools.product(range(H * W), repeat=3)
                           for t in itertools.product(range(T), repeat=2)])
    every = labels.unsqueeze(0).expand(n, *labels.shape)
    brute = (p.task_loss(idx, every) + p.labels_score(theta, idx, every)
             - p.labels_score(theta, idx, p.truth.unsqueeze(1))).max(1).values
    torch.testing.assert_close(H_val, brute, rtol=0, atol=1e-10)


def test_synthetic_type_maps_name_the_type_at_the_child(articulated):
    train, _ = articulated
    et = ts.data.edge_types(train, 3)
    clean = ts.data.synthetic_type_maps(train, et, hit_rate=1.0, miss_rate=0.0, clutter=0, noise=0.0)
    maps = clean.type_maps
    assert maps.shape == (12, 25, 3, 144) and maps.dtype == torch.float32
    child = train.positions[:, 1:]  # edge e's child is node e + 1
    at = maps.gather(3, child.view(12, 25, 1, 1).expand(12, 25, 3, 1)).squeeze(3)  # (n, E, T) at the child
    assert torch.equal(at.argmax(2), et.types)  # the named type is the true one
    torch.testing.assert_close(at.sort(2).values[..., :2], 0.3 * at.max(2).values.unsqueeze(2).expand(12, 25, 2))
    assert torch.equal(maps.argmax(3), child.unsqueeze(2).expand(12, 25, 3))  # every map peaks at the child
    noisy = ts.data.synthetic_type_maps(train, et, hit_rate=0.0, miss_rate=0.0, clutter=0, noise=0.0).type_maps
    named = noisy.gather(3, child.view(12, 25, 1, 1).expand(12, 25, 3, 1)).squeeze(3).argmax(2)
    assert not (named == et.types).any()  # hit_rate 0: always another type
    missed = ts.data.synthetic_type_maps(train, et, miss_rate=1.0, clutter=0, noise=0.0).type_maps
    assert not missed.any()
    assert torch.equal(ts.data.synthetic_type_maps(train, et, seed=4).type_maps,
                       ts.data.synthetic_type_maps(train, et, seed=4).type_maps)
    with pytest.raises(ValueError, match=r"types.types must have shape \(12, 25\)"):
        ts.data.synthetic_type_maps(train, ts.data.EdgeTypes(et.rest, et.types[:3]))
    with pytest.raises(ValueError, match="hit_rate must be finite"):
        ts.data.synthetic_type_maps(train, et, hit_rate=1.5)


def test_problem_with_type_maps_layout_and_identities(articulated):
    train, test = articulated
    et = ts.data.edge_types(train, 2)
    trm = ts.data.synthetic_type_maps(train, et)
    p = MixtureSpatialTreeProblem(trm, 2, types=et)
    V, E, F, T = 26, 25, 2, 2
    assert p.d == V * F + E * T + E + 4 * E * T and p.M == E
    assert p.parameter_slices()["type_map"] == (V * F + E * T, V * F + E * T + E, (E,))
    w = random_w(p, seed=3)
    idx = torch.tensor([1, 7, 4])
    theta = p.potentials(w, idx)
    wu, wt, wm, wc, wp = p.weights(w)
    assert wc.numel() == 0
    torch.testing.assert_close(theta.potentials.child_scores,
                               p.type_scale * wt.view(1, E, T, 1) + wm.view(1, E, 1, 1) * trm.type_maps[idx].double())
    _, score = check_scores(p, w, theta, idx, seed=2)
    labels_hat, loss, H_val = p.oracle(theta, idx)  # the oracle's value is attained by its labelling
    attained = loss + p.labels_score(theta, idx, labels_hat.unsqueeze(1)).squeeze(1) - score[:, 0]
    torch.testing.assert_close(attained, H_val, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="dataset has no type_maps"):
        p.evaluate(w, test)
    tem = ts.data.synthetic_type_maps(test, ts.data.edge_types(test, 2, rest=et.rest))
    assert 0 <= p.evaluate(w, tem)["pck"] <= 1
    with pytest.raises(ValueError, match=r"dataset.type_maps must be a float \(6, 25, 2, 144\)"):
        p.evaluate(w, dataclasses.replace(tem, type_maps=tem.type_maps[:, :, :1]))


def test_cli_train_pose_with_types(capsys):
    from torchssvm.cli import main

    argv = ["train", "--data", "pose", "--types", "2", "--limb-modes", "3", "--num-train", "8", "--num-test", "4",
            "--grid", "10", "--passes", "3", "--lam", "0.1", "--logdir", ""]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 types per edge" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("pass")]
    assert len(lines) == 3
    gaps = [float(ln.split("gap ")[1].split()[0]) for ln in lines]
    assert 0 <= gaps[-1] < gaps[0]
    assert all(float(ln.split("min w_quad ")[1].split()[0]) >= 0 for ln in lines)
    with pytest.raises(SystemExit) as exit_:  # a usage error: exit 2, the flag named on stderr
        main(["train", "--data", "pose", "--types", "2", "--solver", "torch", "--logdir", ""])
    assert exit_.value.code == 2 and re.search('--types > 1 needs a dual solver', capsys.readouterr().err)
    with pytest.raises(SystemExit) as exit_:  # a usage error: exit 2, the flag named on stderr
        main(["train", "--data", "pose", "--types", "0", "--logdir", ""])
    assert exit_.value.code == 2 and re.search('--types must be >= 1', capsys.readouterr().err)
