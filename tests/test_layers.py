"""The library's import layers: no import circle among its modules, and no module importing from a layer above
its own (docs/design.md, "Layers").

The import graph is read from the source with `ast`: every ``import`` and ``from ... import`` of the library's
own modules counts, those inside functions included, and nothing is executed but the import of the two packages
that locates them (``torchssvm`` and ``torchssvm.kernels``, whose files sit in ``kernels/``).
"""

import ast
from pathlib import Path

import pytest

import torchssvm  # imports torchssvm.kernels too

ROOT = "torchssvm"

# Lowest first. A module belongs to the layer of the longest name below that is itself or one of its packages
# (the root package only by its own name); it may import its own layer and the layers below.
LAYERS = (
    # argument checks, host-to-device copies, atomic file writes, the one-thread scope of small steps,
    # TensorBoard writers and progress bars: they import no library module
    ("foundation", ("torchssvm._validation", "torchssvm._device", "torchssvm._atomic", "torchssvm._threads",
                    "torchssvm.logging")),
    # the oracles' torch / Triton / numba kernels
    ("kernels", ("torchssvm.kernels",)),
    # the structures' scores, oracles and task losses
    ("structures", ("torchssvm.structures",)),
    # datasets and the types they hold (TokenFeatures)
    ("data", ("torchssvm.data",)),
    # potential models (LinearChainModel, joint_feature)
    ("models", ("torchssvm.models",)),
    # the searches for the most violating labelling under a loss's scaling
    ("search", ("torchssvm.search",)),
    # the structured hinge, slack-rescaled hinge and CRF losses
    ("losses", ("torchssvm.losses",)),
    # decoding a dataset and scoring the predictions
    ("evaluation", ("torchssvm.metrics", "torchssvm.evaluation")),
    # the dual solvers and the problems they see (a problem maps a model and a dataset to dual blocks)
    ("optim", ("torchssvm.optim",)),
    # the dual solvers on a torch.distributed process group (imported explicitly, never by the root package)
    ("distributed", ("torchssvm.distributed",)),
    # whole training runs as functions
    ("recipes", ("torchssvm.recipes",)),
    # scikit-learn estimators over the solvers (imported explicitly, never by the root package)
    ("sklearn", ("torchssvm.sklearn",)),
    # the command line: parses flags, runs a recipe, prints
    ("cli", ("torchssvm.cli", "torchssvm.__main__")),
    # the package's re-exports, and the test helpers that no library module imports
    ("package", (ROOT, "torchssvm.testing")),
)


def library_modules() -> dict:
    """``{module name: (path, is_package)}`` of every module of the library."""
    modules = {}
    kernels_dir = Path(torchssvm.kernels.__file__).parent
    for package, folder in ((ROOT, Path(torchssvm.__file__).parent), ("torchssvm.kernels", kernels_dir)):
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or (package == ROOT and kernels_dir in path.parents):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            modules[".".join((package, *(parts[:-1] if is_package else parts)))] = (path, is_package)
    return modules


def imported_modules(name: str, is_package: bool, tree: ast.AST, known) -> set:
    """The library modules that module ``name`` imports, anywhere in its source ``tree``: ``from p import x`` counts
    as an import of ``p.x`` when that is a module, else of ``p``; a name outside ``known`` as its closest known
    package; names outside the library are left out."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
    return found


def import_graph(modules: dict) -> dict:
    return {name: imported_modules(name, is_package, ast.parse(path.read_text(), str(path)), modules)
            for name, (path, is_package) in modules.items()}


def layer_of(module: str, layers=LAYERS):
    """``(index, layer name)`` of ``module``, or None when no layer holds it."""
    best = None
    for index, (layer, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if module == prefix or (prefix != ROOT and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index, layer)
    return None if best is None else best[1:]


def find_cycle(graph: dict):
    """One import circle of ``graph`` as a list ``[a, b, ..., a]``, or None."""
    state, stack = {}, []  # state: 1 on the current path, 2 done

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def upward_imports(graph: dict, layers=LAYERS) -> list:
    """``"a (layer) imports b (higher layer)"`` for every import of ``graph`` that goes up the layers."""
    found = []
    for module in sorted(graph):
        own = layer_of(module, layers)
        for target in sorted(graph[module]):
            other = layer_of(target, layers)
            if own is not None and other is not None and other[0] > own[0]:
                found.append(f"{module} ({own[1]}) imports {target} ({other[1]})")
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(library_modules())


def test_the_graph_sees_the_library_and_its_imports(graph):
    """The reader finds both packages and the imports at module level, in functions and relative ones."""
    assert {"torchssvm", "torchssvm.cli", "torchssvm.kernels", "torchssvm.kernels.compile_check",
            "torchssvm.optim.problems.chain"} <= set(graph)
    assert "torchssvm.recipes" in graph["torchssvm.cli"]  # a module-level import
    assert "torchssvm.kernels.chain.viterbi_triton" in graph["torchssvm.kernels.chain.dispatch"]  # in a function
    assert "torchssvm._validation" in graph["torchssvm.kernels.chain.dispatch"]  # an absolute one from kernels/
    assert "torchssvm.data.sequence_dataset" in graph["torchssvm.optim.problems.chain"]  # from ...data.x import


def test_every_module_has_a_layer(graph):
    missing = sorted(m for m in graph if layer_of(m) is None)
    assert not missing, f"add these modules to a layer of LAYERS (tests/test_layers.py, docs/design.md): {missing}"


def test_no_import_cycles(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_module_imports_from_a_higher_layer(graph):
    found = upward_imports(graph)
    assert not found, "imports from a higher layer:\n" + "\n".join(found)


def test_the_cli_reaches_the_library_only_through_the_recipes(graph):
    """The command line parses flags and calls a recipe: its training loops live in `torchssvm.recipes`."""
    recipes = {m for m in graph if m == "torchssvm.recipes" or m.startswith("torchssvm.recipes.")}
    assert graph["torchssvm.cli"] and graph["torchssvm.cli"] <= recipes, sorted(graph["torchssvm.cli"] - recipes)


def test_the_checks_catch_a_circle_and_an_upward_import(graph):
    bad = {**graph, "torchssvm.data.pose": graph["torchssvm.data.pose"] | {"torchssvm.models"}}
    assert upward_imports(bad) == ["torchssvm.data.pose (data) imports torchssvm.models (models)"]
    atoms = "torchssvm.optim.frank_wolfe.atoms"
    bad = {**graph, atoms: graph[atoms] | {"torchssvm.optim.frank_wolfe.bcfw"}}
    cycle = find_cycle(bad)
    assert cycle is not None and cycle[0] == cycle[-1] and atoms in cycle
    assert layer_of("torchssvm.newmodule") is None and layer_of("torchssvm") == (len(LAYERS) - 1, "package")


def test_compile_check_compiles_the_pose_tree_of_the_data():
    """The kernels' compile check writes out the pose skeleton rather than import the data layer above it."""
    from torchssvm.kernels import compile_check

    from torchssvm.data.pose import POSE_PARENTS

    assert compile_check._POSE_PARENTS == POSE_PARENTS
