"""The dual solvers on a torch.distributed process group: the examples split across ranks, ``w`` replicated, the
iterates those of one process (docs/distributed.md).

- `shard_range`, `shard_dataset`: which examples a rank holds (contiguous ranges in rank order).
- `ShardedProblem`: a rank's `DualProblem` with the global n, the offsets and the collectives (`Collectives`).
- `DistributedBCFW`, `DistributedFrankWolfe`, `DistributedNSlackCuttingPlane`: `BCFW` (every variant, the host-free
  step included), `FrankWolfe` and `NSlackCuttingPlane` on shards, with a ``process_group``.
- `save_sharded`, `load_sharded`: a state per rank and a manifest written by rank 0.

Imported explicitly (``import torchssvm.distributed``), never by the root package: single-process users load
nothing of it.
"""

from .bcfw import DistributedBCFW
from .checkpoint import load_sharded, read_manifest, save_sharded
from .comm import Collectives
from .frank_wolfe import DistributedFrankWolfe
from .nslack import DistributedNSlackCuttingPlane
from .problem import ShardedProblem
from .shard import shard_dataset, shard_range

__all__ = ["Collectives", "DistributedBCFW", "DistributedFrankWolfe", "DistributedNSlackCuttingPlane", "ShardedProblem",
           "load_sharded", "read_manifest", "save_sharded", "shard_dataset", "shard_range"]
