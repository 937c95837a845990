from .common import ConvFFN, LayerNorm2d
from .paca import (CLUSTERING_TYPES, PaCaAttention, build_clustering,
                   cluster_softmax)

__all__ = ['ConvFFN', 'LayerNorm2d', 'PaCaAttention', 'build_clustering',
           'cluster_softmax', 'CLUSTERING_TYPES']
