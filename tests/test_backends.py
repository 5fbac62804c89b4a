"""The backend table (`torchssvm.kernels.backends`): one place says which operation has which forms, and every
dispatcher and caller resolves through it."""

import ast
from pathlib import Path

import pytest
import torch
import torchssvm.kernels as K
from torchssvm.kernels import backends

import torchssvm

CPU = torch.device("cpu")


def test_auto_picks_numba_on_the_cpu_only_where_a_numba_form_exists(monkeypatch):
    for op, forms in backends.FORMS.items():
        assert forms[0] == "torch" and set(forms) <= {"torch", "triton", "numba"}, op
        want = "numba" if "numba" in forms and backends.numba_available() else "torch"
        assert backends.resolve(op, "auto", CPU) == want, op
        assert backends.resolve(op, "torch", CPU) == "torch"
    x64, x32, h = torch.zeros(1, dtype=torch.float64), torch.zeros(1), torch.zeros(1, dtype=torch.float16)
    if backends.numba_available():
        assert backends.resolve("viterbi", "auto", CPU, x64, None, x64) == "numba"
        assert backends.resolve("viterbi", "auto", CPU, x64, x32) == "torch"  # mixed dtypes: torch promotes
        assert backends.resolve("viterbi", "auto", CPU, h) == "torch"  # no half types in the compiled loops
    monkeypatch.setattr(K._numba, "numba", None)  # as without numba installed
    assert backends.resolve("viterbi", "auto", CPU) == "torch"
    with pytest.raises(RuntimeError, match="numba package"):
        backends.resolve("viterbi", "numba", CPU)


def test_a_missing_form_is_refused_naming_the_operation_and_its_forms():
    with pytest.raises(ValueError, match=r"backend='numba': select_atoms has no numba form; its forms: torch "
                                         r"\(any device\), triton \("):
        backends.resolve("select_atoms", "numba", CPU)
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.resolve("viterbi", "cuda", CPU)
    with pytest.raises(KeyError, match="no operation 'viterbi2'"):
        backends.resolve("viterbi2", "auto", CPU)
    # the error reaches the user from the public functions, whatever layer they enter by
    with pytest.raises(ValueError, match="project_simplex has no numba form"):
        K.project_simplex(torch.rand(2, 3), backend="numba")
    with pytest.raises(ValueError, match="structure_oracle has no numba form"):
        torchssvm.Multiclass(3).max_oracle(torch.zeros(2, 3), torch.tensor([0, 1]), backend="numba")


def test_structures_name_their_oracle_in_the_table():
    assert torchssvm.Chain(3).oracle_op == "viterbi" and torchssvm.Chain(3).has_numba_oracle
    assert not torchssvm.Multiclass(3).has_numba_oracle
    for s in (torchssvm.Chain(3), torchssvm.Multiclass(3)):
        assert s.oracle_op in backends.FORMS


def _calls(path: Path, name: str) -> list:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def test_every_dispatch_resolves_through_the_table():
    """No library module resolves a backend but through `backends.resolve` (the deprecated `resolve_backend` is
    kept for callers outside), and every operation named in a call of `resolve` is a row of the table."""
    roots = [Path(torchssvm.__file__).parent, Path(K.__file__).parent]
    named = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if path.name == "backends.py":
                continue
            assert not _calls(path, "resolve_backend"), path.name
            for call in _calls(path, "resolve"):
                if call.args and isinstance(call.args[0], ast.Constant):
                    named.add(call.args[0].value)
    assert named and named <= set(backends.FORMS), named - set(backends.FORMS)
    # every row but the structures' and the fused hinge's is the name of a public dispatcher
    for op in set(backends.FORMS) - {backends.STRUCTURE_ORACLE, "chain_hinge", "insert_atoms"}:
        assert callable(getattr(K, op)), op
