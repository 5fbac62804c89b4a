"""Datasets: real benchmarks (read from ``root=``, ``$TORCHSSVM_DATA`` or a cache dir) and seeded
synthetic generators. A file that is damaged or not the documented one raises a `DataFileError` (a ValueError)
naming it and what is wrong."""

from .adult import a9a
from .checkers import checkers
from .checks import DataFileError
from .conll2000 import conll2000
from .large_chain import synthetic_large_chain
from .multilabel_dataset import MultiLabelBatch, MultiLabelDataset
from .ocr import ocr
from .paths import DownloadError, UnverifiedDownloadWarning, data_root
from .pose import EdgeTypes, PoseDataset, edge_types, synthetic_pose, synthetic_type_maps
from .sequence_dataset import ChainBatch, SequenceDataset
from .synthetic import synthetic_chain
from .token_features import TokenFeatures
from .yeast import yeast

__all__ = ["ocr", "conll2000", "yeast", "synthetic_chain", "SequenceDataset", "ChainBatch", "MultiLabelDataset",
           "MultiLabelBatch", "data_root"]
__all__ += ["a9a", "checkers", "synthetic_pose", "PoseDataset", "edge_types", "EdgeTypes", "synthetic_type_maps"]
__all__ += ["synthetic_large_chain", "TokenFeatures", "DataFileError", "DownloadError", "UnverifiedDownloadWarning"]
