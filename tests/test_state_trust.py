"""A loaded dual state is checked, not trusted: every edit of a saved state is refused or harmless.

`DualSolver._check_consistency` recomputes from a state what needs no oracle (v from the blocks, the losses the blocks
imply, the blocks' marginal constraints, the atoms against the blocks) and the fingerprint ties a state to its data.
Here each tensor of saved states is edited the ways a corrupted disk or a careless script edits it (bytes flipped,
an entry moved, scaled, zeroed, negated, another dtype) and each scalar counter made negative; each edit must raise
a ValueError or leave the certificate (exact primal, dual and gap of the loaded solver) equal to the original's.
"""

import math

import pytest
import torch
from test_cutting_plane import random_table

import torchssvm as ts
from torchssvm.optim import BCFW, FeatureTableProblem, FrankWolfe, NSlackCuttingPlane


def _chain(seed=0, n=24):
    return ts.data.synthetic_chain("train", n=n, num_labels=4, num_features=5, min_length=2, max_length=6, seed=seed,
                                   dtype=torch.float64)


def _model(ds):
    return ts.models.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64)


CONFIGS = {
    "table-bcfw": lambda: BCFW(FeatureTableProblem(*random_table(n=16)), lam=0.05),
    "table-fw": lambda: FrankWolfe(FeatureTableProblem(*random_table(n=16)), lam=0.05),
    "table-nslack": lambda: NSlackCuttingPlane(FeatureTableProblem(*random_table(n=16)), lam=0.05),
    "chain-bcfw": lambda: BCFW(_model(_chain()), _chain(), lam=0.05),
    "chain-bcfw-pairwise-cache": lambda: BCFW(_model(_chain()), _chain(), lam=0.05, step="pairwise", cache_size=4),
    "chain-bcfw-batch-gap": lambda: BCFW(_model(_chain()), _chain(), lam=0.05, batch_size=4, sampling="gap",
                                         step="pairwise", cache_size=4, gap_check_every=1),
    "chain-bcfw-slack": lambda: BCFW(_model(_chain()), _chain(), lam=0.05, rescaling="slack"),
}


def _flat(state: dict) -> dict:
    out = {k: v for k, v in state.items() if k != "atoms"}
    out.update({f"atoms.{k}": v for k, v in (state.get("atoms") or {}).items()})
    return out


def _with(state: dict, key: str, value) -> dict:
    s = dict(state)
    if key.startswith("atoms."):
        s["atoms"] = {**s["atoms"], key[6:]: value}
    else:
        s[key] = value
    return s


def _tensor_edits(t: torch.Tensor, g: torch.Generator):
    """(name, edited copy) of ``t``: 8 flipped bytes (5 draws), one entry +1 / x1.01 / -x, all x1.01, zeroed,
    negated, float32."""
    if t.numel() == 0:
        return
    for draw in range(5):
        b = t.clone().contiguous().view(torch.uint8).reshape(-1)
        pos = torch.randint(b.numel(), (8,), generator=g)
        b[pos] ^= torch.randint(1, 256, (8,), generator=g, dtype=torch.uint8)
        yield f"flip8-{draw}", b.view(t.dtype).reshape(t.shape)
    i = int(torch.randint(t.numel(), (1,), generator=g))
    if t.dtype == torch.bool:
        e = t.clone().reshape(-1)
        e[i] = ~e[i]
        yield "toggle-one", e.reshape(t.shape)
        return
    for name, f in (("plus1-one", lambda x: x + 1), ("scale-one", lambda x: x * 1.01 if x.is_floating_point()
                                                        else x * 2), ("negate-one", lambda x: -x)):
        e = t.clone().reshape(-1)
        e[i] = f(e[i])
        yield name, e.reshape(t.shape)
    if t.is_floating_point():
        yield "scale-all", t * 1.01
        yield "to-float32", t.float()
    yield "zero-all", torch.zeros_like(t)
    yield "negate-all", -t


def _certificate(solver) -> tuple:
    r = solver.duality_gap()
    return r["primal"], r["dual"], r["gap"]


def _same_certificate(a, b) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a, b))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_edit_of_a_saved_dual_state_is_refused_or_harmless(config):
    make = CONFIGS[config]
    source = make()
    for _ in range(4):
        source.step()
    state = source.state_dict()
    reference = _certificate(source)
    g = torch.Generator().manual_seed(0)
    outcomes = {"refused": 0, "harmless": 0}
    harmful = []
    flat = _flat(state)
    edits = []
    for key, value in flat.items():
        if key == "generator":  # the sampler's state: any value a generator takes is a valid draw sequence
            continue
        if isinstance(value, torch.Tensor):
            edits += [(key, name, e) for name, e in _tensor_edits(value, g)]
        elif isinstance(value, int) and not isinstance(value, bool) and key not in ("seed",):
            edits.append((key, "negative", -1 - value))
        elif isinstance(value, float) and key in ("seconds",):
            edits.append((key, "negative", -1.0))
    assert len(edits) >= 40
    for key, name, value in edits:
        target = make()
        try:
            target.load_state_dict(_with(state, key, value))
        except ValueError:
            outcomes["refused"] += 1
            continue
        if _same_certificate(_certificate(target), reference):
            outcomes["harmless"] += 1
        else:
            harmful.append(f"{key}:{name} -> {_certificate(target)} vs {reference}")
    assert not harmful, f"{config}: {len(harmful)} edits accepted with another certificate: {harmful[:5]}"
    print(f"\n{config}: {len(edits)} edits, {outcomes['refused']} refused, {outcomes['harmless']} harmless")
    assert outcomes["refused"] > outcomes["harmless"]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_an_unedited_state_loads_and_resumes_the_same_run(config):
    make = CONFIGS[config]
    source = make()
    for _ in range(3):
        source.step()
    target = make()
    target.load_state_dict(source.state_dict())
    assert _same_certificate(_certificate(target), _certificate(source))
    a, b = source.step(), target.step()
    assert a["dual"] == b["dual"] and a["passes"] == b["passes"]


def test_a_state_of_other_data_with_the_same_sizes_is_refused():
    ds = _chain()
    source = BCFW(_model(ds), ds, lam=0.05)
    for _ in range(2):
        source.step()
    state = source.state_dict()
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(3))
    permuted = ts.data.SequenceDataset(ds.x[perm], ds.y[perm], ds.lengths[perm], num_labels=ds.num_labels,
                                       num_features=ds.num_features)
    other = _chain(seed=5)
    assert other.x.shape == ds.x.shape
    for data in (permuted, other):
        target = BCFW(_model(data), data, lam=0.05)
        with pytest.raises(ValueError, match="other training data"):
            target.load_state_dict(state)
    table = BCFW(FeatureTableProblem(*random_table(n=16, seed=1)), lam=0.05)
    with pytest.raises(ValueError, match="other training data"):
        table.load_state_dict(BCFW(FeatureTableProblem(*random_table(n=16, seed=2)), lam=0.05).state_dict())


def test_a_state_without_a_fingerprint_or_of_lower_precision_is_refused():
    make = CONFIGS["table-bcfw"]
    state = make().state_dict()
    with pytest.raises(ValueError, match="fingerprint"):
        make().load_state_dict({k: v for k, v in state.items() if k != "fingerprint"})
    with pytest.raises(ValueError, match=r"state_dict\['z'\] is torch.float32"):
        make().load_state_dict({**state, "z": state["z"].float()})


def test_loaded_state_carries_no_certificate_until_an_exact_pass():
    make = CONFIGS["table-fw"]
    source = make()
    source.step()
    assert source.last_exact is not None
    state = source.state_dict()
    state["last_exact"] = {"primal": 0.0, "gap": 0.0, "passes": 1.0}  # a forged certificate
    target = make()
    target.load_state_dict(state)
    assert target.last_exact is None


def test_a_state_of_other_run_settings_names_them():
    """A state refused for a setting of the run, not for corruption, says which setting and what to do: the atom store
    that cache_size and pairwise / away steps keep, a box of the same shape with other values, and (the 1-slack
    method) cuts older than this solver's inactive_after."""
    table = FeatureTableProblem(*random_table(n=16))
    cached = BCFW(table, lam=0.05, cache_size=3)
    cached.step()
    with pytest.raises(ValueError, match=r"saved with an atom store .* this solver runs without one \(cache_size = 0, "
                                         r"step = 'fw'\): build it with the run's cache_size and step"):
        BCFW(table, lam=0.05).load_state_dict(cached.state_dict())
    boxed = BCFW(table, lam=0.05, box=(0.0, None))
    with pytest.raises(ValueError, match="saved with another box: a tensor of shape .* with other values"):
        BCFW(table, lam=0.05, box=(-1.0, 1.0)).load_state_dict(boxed.state_dict())
    from test_state_consistency_primal import BUNDLES

    old = BUNDLES["oneslack"]()
    for _ in range(6):
        old.step()
    assert int(old.age.max()) > 0
    young = BUNDLES["oneslack"]()
    young.inactive_after = 1
    with pytest.raises(ValueError, match="saved with a larger inactive_after"):
        young.load_state_dict(old.state_dict())
