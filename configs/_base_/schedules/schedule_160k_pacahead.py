# The PaCa-head recipe (paper Appendix B.3): schedule_160k plus lr x10 (6e-4) for the head
# and for the backbone's cluster-count-dependent output layers, which are re-initialised
# when the ImageNet checkpoint (100 clusters) is loaded with 200 clusters.
# mmengine matches custom keys as substrings of the parameter names, longest key first.
_base_ = ['./schedule_160k.py']
_head = dict(lr_mult=10.)
_head_norm = dict(lr_mult=10., decay_mult=0.)  # the paper excludes all norms from decay
optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={
            'decode_head': _head,
            # the head's BN layers (ConvModule 'bn' and the K/V LinearBlock norms)
            'decode_head.convs.0.bn': _head_norm,
            'decode_head.convs.1.bn': _head_norm,
            'decode_head.convs.2.bn': _head_norm,
            'decode_head.convs.3.bn': _head_norm,
            'decode_head.q.0.bn': _head_norm,
            'decode_head.clustering.0.bn': _head_norm,
            'decode_head.k.2': _head_norm,
            'decode_head.v.2': _head_norm,
            'decode_head.proj.bn': _head_norm,
            # cluster output layers: conv clustering (Eqn. 5) and the ec teacher;
            # the mlp variant adds 'clustering.clustering.2' in its own config (in the conv
            # variant that name is the middle PWConv, which keeps lr x1)
            'clustering.clustering.4': _head,
            'paca_teacher.to_clusters': _head,
        }))
