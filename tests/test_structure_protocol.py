"""The public structure protocol (`torchssvm.structures.base.Structure`, docs/design.md "Structures"): callers outside
`torchssvm.structures` use public names only, ask capabilities instead of types, and the unchecked tier returns what
the checked one returns."""

import ast
import itertools
import pathlib

import pytest
import torch

import torchssvm as ts
from torchssvm.search import StructureOracle, TableOracle
from torchssvm.structures import base as structures_base
from torchssvm.structures.base import CAPABILITIES, Structure

PACKAGE = pathlib.Path(ts.__file__).resolve().parent
STRUCTURES = PACKAGE / "structures"

#: hooks each capability's structures implement (and the others leave to `Structure`)
HOOKS = {"has_slack_oracle": "_slack_max_oracle", "has_log_partition": "_log_partition",
         "has_table_oracle": "_labelling_table", "has_max_task_loss": "_max_task_loss"}


def _structure_classes():
    out, stack = [], [Structure]
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return [c for c in out if c.__module__.startswith("torchssvm.structures")]


def _private_structure_names():
    """Underscore (not dunder) methods and attributes defined by the classes of `torchssvm.structures`."""
    names = set()
    for path in STRUCTURES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                    isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)):
                name = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else node.attr
                if name.startswith("_") and not name.startswith("__"):
                    names.add(name)
    return names


def _outside_structures():
    for path in sorted(PACKAGE.rglob("*.py")):
        if STRUCTURES not in path.parents:
            yield path, path.relative_to(PACKAGE).as_posix()


def test_no_private_structure_name_is_used_outside_structures():
    """(a) Nothing outside `torchssvm.structures` reaches a structure's underscore methods or attributes (the hooks):
    ``self._name`` inside a class of its own module is that class's business."""
    names = _private_structure_names()
    assert {"_max_oracle", "_score", "_task_loss", "_slack_max_oracle", "_hinge_forward"} <= names
    found = []
    for path, rel in _outside_structures():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr in names):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "private structure names used outside torchssvm/structures:\n" + "\n".join(found)


def test_losses_and_searches_ask_capabilities_not_types():
    """(b) No ``isinstance(x, <a Structure subclass>)`` in losses.py or search/: they ask a capability."""
    classes = {c.__name__ for c in _structure_classes()} - {"Structure"}
    found = []
    for path in [PACKAGE / "losses.py", *sorted((PACKAGE / "search").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                named = {k.id if isinstance(k, ast.Name) else getattr(k, "attr", None) for k in kinds}
                if named & classes:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_capabilities_are_declared_with_their_hooks():
    """Each capability is False on `Structure`, and a structure declares it exactly where it implements the hook."""
    assert set(CAPABILITIES) == set(HOOKS)
    for cap in CAPABILITIES:
        assert getattr(Structure, cap) is False
    for cls in _structure_classes():
        for cap, hook in HOOKS.items():
            implemented = getattr(cls, hook) is not getattr(Structure, hook)
            assert bool(getattr(cls, cap)) == implemented, (cls.__name__, cap)
    expected = {"Multiclass": set(HOOKS), "MultiLabel": set(HOOKS),
                "Chain": {"has_slack_oracle", "has_log_partition", "has_max_task_loss"},
                "Hierarchy": {"has_slack_oracle"}, "Tree": {"has_max_task_loss"}, "SpatialTree": {"has_max_task_loss"},
                "MixtureSpatialTree": {"has_max_task_loss"}}
    for name, caps in expected.items():
        cls = getattr(ts, name)
        assert {c for c in CAPABILITIES if getattr(cls, c)} == caps, name
    with pytest.raises(ValueError, match="unknown capability"):
        ts.Multiclass(2).require("has_everything")


# -- tiny instances, brute force ----------------------------------------------------------------------------------
def _instances():
    """``(structure, potentials, target, lengths, labellings)``: a batch of 3 small examples and every labelling."""
    g = torch.Generator().manual_seed(0)
    f64 = torch.float64
    B = 3

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=f64)

    def pick(labellings):
        return labellings[torch.randint(0, labellings.shape[0], (B,), generator=g)]

    def product(*ranges):
        return torch.tensor(list(itertools.product(*ranges)), dtype=torch.long)

    out = []
    labs = torch.arange(4)
    out.append((ts.Multiclass(4, class_weights=torch.tensor([1.0, 2.0, 0.5, 1.0])), randn(B, 4), pick(labs), None,
                labs))
    labs = product(range(3), range(3), range(3))
    out.append((ts.Chain(3), ts.ChainPotentials(randn(B, 3, 3), randn(3, 3), randn(3), randn(3)), pick(labs),
                torch.full((B,), 3), labs))
    ml = ts.MultiLabel(3, class_weights=torch.tensor([1.0, 0.5, 2.0]))
    labs = ml.configurations()
    out.append((ml, ts.MultiLabelPotentials(randn(B, 3), randn(ml.num_edges)), pick(labs), None, labs))
    hier = ts.Hierarchy([-1, 0, 0, -1])
    labs = hier.configurations()
    out.append((hier, randn(B, 4), pick(labs), None, labs))
    labs = product(range(2), range(2), range(2))
    out.append((ts.Tree([-1, 0, 0], 2), ts.TreePotentials(randn(B, 3, 2), randn(2, 2, 2)), pick(labs), None, labs))
    labs = product(range(4), range(4))
    rest = torch.tensor([[1.0, 0.0]], dtype=f64)
    weights = torch.rand(1, 4, generator=g, dtype=f64)
    scale = torch.rand(B, generator=g, dtype=f64) + 0.5
    out.append((ts.SpatialTree([-1, 0], 2, 2), ts.SpatialTreePotentials(randn(B, 2, 4), weights, rest), pick(labs),
                scale, labs))
    labs = product(range(4), range(4), range(2))
    mix = ts.MixtureSpatialTree([-1, 0], 2, 2, 2)
    pot = ts.MixtureTreePotentials(randn(B, 2, 4), torch.rand(1, 2, 4, generator=g, dtype=f64),
                                   torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=f64), randn(B, 1, 2, 4))
    out.append((mix, pot, pick(labs), scale, labs))
    return out


INSTANCES = _instances()
IDS = [type(case[0]).__name__ for case in INSTANCES]


def _ragged_chain():
    """A chain batch with lengths below the padded size (labels past a length: anything; `validate` sets -1)."""
    g = torch.Generator().manual_seed(1)
    chain = ts.Chain(4, normalize=False)
    pot = ts.ChainPotentials(torch.randn(5, 6, 4, generator=g, dtype=torch.float64),
                             torch.randn(4, 4, generator=g, dtype=torch.float64))
    return chain, pot, torch.randint(0, 4, (5, 6), generator=g), torch.tensor([6, 1, 3, 5, 2]), None


def _brute(structure, pot, target, lengths, labs):
    """``(scores, losses)`` ``(B, N)`` of every labelling, by the checked `score` and `task_loss`."""
    B = target.shape[0]
    scores, losses = [], []
    for y in labs:
        ys = y.expand(B, *y.shape).contiguous()
        scores.append(structure.score(pot, ys, lengths))
        losses.append(structure.task_loss(ys, target, lengths))
    return torch.stack(scores, 1).to(torch.float64), torch.stack(losses, 1)


@pytest.mark.parametrize("case", INSTANCES, ids=IDS)
def test_each_capability_agrees_with_brute_force_or_raises_naming_it(case):
    """(c) A structure with a capability gives what enumeration gives; one without raises the documented error, a
    NotImplementedError naming the structure and the capability."""
    st, pot, target, lengths, labs = case
    name = type(st).__name__
    scores, losses = _brute(st, pot, target, lengths, labs)
    gold = st.score(pot, target, lengths).to(torch.float64)

    def missing(cap):
        return pytest.raises(NotImplementedError, match=f"{name} has no .*{cap} is False")

    if st.has_slack_oracle:
        y_hat, value = st.slack_max_oracle(pot, target, lengths)
        phi = (losses * (1 + scores - gold.unsqueeze(1))).max(1).values.clamp_min(0)
        torch.testing.assert_close(value.to(torch.float64), phi, rtol=1e-12, atol=1e-12)
        attained = st.task_loss(y_hat, target, lengths) * (1 + st.score(pot, y_hat, lengths) - gold)
        torch.testing.assert_close(attained.clamp_min(0), phi, rtol=1e-12, atol=1e-12)
    else:
        with missing("has_slack_oracle"):
            st.slack_max_oracle(pot, target, lengths)
        with missing("has_slack_oracle"):
            ts.slack_rescaled_hinge_loss(st, pot, target, lengths)
    if st.has_log_partition:
        torch.testing.assert_close(st.log_partition(pot, lengths).to(torch.float64), scores.logsumexp(1),
                                   rtol=1e-12, atol=1e-12)
    else:
        with missing("has_log_partition"):
            st.log_partition(pot, lengths)
        with missing("has_log_partition"):
            ts.crf_negative_log_likelihood(st, pot, target, lengths)
    if st.has_table_oracle:
        table_labels, s, g, truth = st.labelling_table(pot, target)
        order = [next(i for i, y in enumerate(labs) if torch.equal(y, t)) for t in table_labels]
        assert sorted(order) == list(range(labs.shape[0]))  # every labelling, once
        torch.testing.assert_close(s, scores[:, order], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, losses[:, order], rtol=0, atol=0)
        assert torch.equal(table_labels[truth], target)
        oracle = TableOracle.from_structure(st, pot, target)
        assert torch.equal(oracle.truth, truth)
    else:
        with missing("has_table_oracle"):
            st.labelling_table(pot, target)
        with pytest.raises(TypeError, match=f"{name} has no .*has_table_oracle"):
            TableOracle.from_structure(st, pot, target)
        with pytest.raises(ValueError, match=r"has_table_oracle is False\): search='angular' needs the constrained"):
            ts.SlackRescaledHingeLoss(st, search="angular")
    checked_pot, checked_lengths, checked_target = st.validate(pot, lengths, target)
    if st.has_max_task_loss:
        top = st.unchecked.max_task_loss(checked_target, checked_lengths)
        assert top.dtype == torch.float64
        torch.testing.assert_close(top, losses.max(1).values, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(StructureOracle(st, pot, target, lengths).max_g(), top, rtol=0, atol=0)
    else:
        with missing("has_max_task_loss"):
            st.unchecked.max_task_loss(checked_target, checked_lengths)
        with missing("has_max_task_loss"):
            StructureOracle(st, pot, target, lengths).max_g()


def _same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


@pytest.mark.parametrize("case", INSTANCES + [_ragged_chain()], ids=IDS + ["ragged Chain"])
def test_the_unchecked_tier_returns_what_the_checked_tier_returns(case):
    """(d) ``structure.unchecked.<name>`` on validated inputs returns exactly what ``structure.<name>`` returns."""
    st, pot, target, lengths, labs = case
    vp, vl, vt = st.validate(pot, lengths, target)
    fast = st.unchecked
    y_hat = st.decode(pot, lengths)
    lw = torch.linspace(0.5, 2.0, target.shape[0], dtype=torch.float64)
    for weight in (1.0, 1.5, lw):
        _same(fast.max_oracle(vp, vt, vl, loss_weight=weight), st.max_oracle(pot, target, lengths, loss_weight=weight))
        _same(fast.decode(vp, vl, target=vt, loss_weight=weight),
              st.decode(pot, lengths, target=target, loss_weight=weight))
    _same(fast.max_oracle(vp, None, vl), st.max_oracle(pot, None, lengths))
    _same(fast.decode(vp, vl), y_hat)
    _same(fast.score(vp, vt, vl), st.score(pot, target, lengths))
    _same(fast.task_loss(y_hat, vt, vl), st.task_loss(y_hat, target, lengths))
    if st.has_slack_oracle:
        _same(fast.slack_max_oracle(vp, vt, vl), st.slack_max_oracle(pot, target, lengths))
    if st.has_log_partition:
        _same(fast.log_partition(vp, vl), st.log_partition(pot, lengths))
    if st.has_table_oracle:
        _same(fast.labelling_table(vp, vt), st.labelling_table(pot, target))
    # the hinge's steps, after its own boundary
    hp, hl, ht = st.validate_hinge(pot, lengths, target)
    loss, y_aug, _, _ = fast.hinge_forward(hp, ht, hl, loss_weight=1.0)
    _same(loss, ts.structured_hinge_loss(st, pot, target, lengths, reduction="none"))
    _same(y_aug, st.decode(pot, lengths, target=target))
    assert repr(fast) == f"{st!r}.unchecked"


def test_structure_specific_helpers_are_public():
    """The helpers the dual problems read (loss weights, the pose feature map) have public names."""
    chain = ts.Chain(3, normalize=False, class_weights=torch.tensor([1.0, 2.0, 3.0]))
    y, lengths = torch.tensor([[0, 2, 1], [1, 1, -1]]), torch.tensor([3, 2])
    w = chain.position_loss_weights(y, lengths)
    assert w.tolist() == [[1.0, 3.0, 2.0], [2.0, 2.0, 0.0]]
    ml = ts.MultiLabel(2, class_weights=torch.tensor([1.0, 3.0]))
    assert ml.label_costs(torch.tensor([[0, 1]]), torch.float64).tolist() == [[0.5, 1.5]]
    tree = ts.SpatialTree([-1, 0], 2, 3)
    x, row = tree.xy(torch.tensor([[0, 5]]))
    assert x.tolist() == [[0, 2]] and row.tolist() == [[0, 1]]
    d = tree.deltas(torch.tensor([[0, 5]]), torch.zeros(1, 2, dtype=torch.float64), torch.float64)
    assert d.tolist() == [[[2.0, 4.0, 1.0, 1.0]]]
    assert [t.tolist() for t in tree.edge_nodes("cpu")] == [[0], [1]]
    assert structures_base.Unchecked.__slots__ == ("structure",)
