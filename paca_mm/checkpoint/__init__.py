"""PaCa-ViT checkpoints: safe loading (:mod:`.loading`) and conversion (:mod:`.convert`)."""
from .convert import (adapt_cluster_layers, cluster_count_keys, convert_official_to_classifier,
                      extract_backbone_state_dict, load_backbone_checkpoint, match_state_dict,
                      save_checkpoint_atomic, state_dict_of)
from .loading import (TRUST_ENV, CheckpointError, allow_mmengine_checkpoint_globals,
                      install_safe_checkpoint_loading, load_checkpoint_file,
                      mmengine_checkpoint_globals, safe_torch_load, trust_checkpoints,
                      trust_requested)

__all__ = [
    'CheckpointError', 'TRUST_ENV', 'adapt_cluster_layers', 'allow_mmengine_checkpoint_globals',
    'cluster_count_keys', 'convert_official_to_classifier', 'extract_backbone_state_dict',
    'install_safe_checkpoint_loading', 'load_backbone_checkpoint', 'load_checkpoint_file',
    'match_state_dict', 'mmengine_checkpoint_globals', 'safe_torch_load',
    'save_checkpoint_atomic', 'state_dict_of', 'trust_checkpoints', 'trust_requested'
]
