"""Primal methods: the stochastic subgradient baseline (`SSG`), `Pegasos` (a ``torch.optim`` optimizer for any
loss) and the accelerated Pragam (`Pragam`, `MulticlassPragam`)."""

from .pegasos import Pegasos
from .pragam import Pragam
from .pragam_multiclass import MulticlassPragam
from .ssg import SSG

__all__ = ["Pegasos", "Pragam", "MulticlassPragam", "SSG"]
