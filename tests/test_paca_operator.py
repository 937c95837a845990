"""The PaCa operator against a naive reference, gradcheck, equivariance, independence."""
import math

import pytest
import torch

from paca_mm.models.layers import PaCaAttention


def naive_paca(attn: PaCaAttention, x, hw):
    """Eqns. 1-3 written out: explicit softmaxes and matmuls, one head at a time."""
    B, N, C = x.shape
    h = attn.num_heads
    d = C // h
    if attn.num_clusters > 0:
        logits = attn.clustering(x, hw)                       # (B, M, N)
        z = torch.exp(logits - logits.max(-1, keepdim=True).values)
        z = z / z.sum(-1, keepdim=True)                       # softmax over N
        c = torch.einsum('bmn,bnc->bmc', z, x)
        mu = c.mean(-1, keepdim=True)
        var = ((c - mu) ** 2).mean(-1, keepdim=True)
        c = (c - mu) / torch.sqrt(var + attn.cluster_norm.eps) * attn.cluster_norm.weight \
            + attn.cluster_norm.bias
    else:
        c = x
    q = x @ attn.q.weight.T + attn.q.bias
    k = c @ attn.k.weight.T + attn.k.bias
    v = c @ attn.v.weight.T + attn.v.bias
    heads = []
    for j in range(h):
        sl = slice(j * d, (j + 1) * d)
        s = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(d)
        a = torch.exp(s - s.max(-1, keepdim=True).values)
        a = a / a.sum(-1, keepdim=True)                       # softmax over M (keys)
        heads.append(a @ v[..., sl])
    return torch.cat(heads, -1) @ attn.proj.weight.T + attn.proj.bias


def _layer(clustering, m=5, dim=24, heads=3, dtype=torch.float64):
    torch.manual_seed(0)
    layer = PaCaAttention(dim, heads, m, clustering if m else None).to(dtype)
    for p in layer.parameters():  # non-trivial norms/biases
        torch.nn.init.normal_(p, std=0.3)
    return layer.eval()


@pytest.mark.parametrize('clustering,m', [('conv', 5), ('mlp', 5), ('linear', 5), (None, 0)])
def test_matches_naive_reference(clustering, m):
    layer = _layer(clustering, m)
    x = torch.randn(2, 4 * 6, 24, dtype=torch.float64)
    out, _, _ = layer(x, (4, 6))
    ref = naive_paca(layer, x, (4, 6))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    # and in float32
    layer32 = layer.float()
    out32, _, _ = layer32(x.float(), (4, 6))
    torch.testing.assert_close(out32, ref.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'linear'])
def test_gradcheck(clustering):
    layer = _layer(clustering, m=3, dim=8, heads=2)
    x = torch.randn(1, 3 * 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t, (3, 4))[0], (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize('clustering', ['mlp', 'linear'])
def test_patch_permutation_equivariance(clustering):
    layer = _layer(clustering)
    x = torch.randn(2, 20, 24, dtype=torch.float64)
    perm = torch.randperm(20)
    out, z, _ = layer(x, (4, 5))
    out_p, z_p, _ = layer(x[:, perm], (4, 5))
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(z_p, z[:, :, perm])


def test_conv_clustering_is_position_dependent():
    layer = _layer('conv')
    x = torch.randn(1, 20, 24, dtype=torch.float64)
    perm = torch.randperm(20)
    out, _, _ = layer(x, (4, 5))
    out_p, _, _ = layer(x[:, perm], (4, 5))
    assert not torch.allclose(out_p, out[:, perm])


@pytest.mark.parametrize('clustering', ['conv', 'mlp', None])
def test_batch_elements_are_independent(clustering):
    layer = _layer(clustering, m=5 if clustering else 0)
    x = torch.randn(3, 12, 24, dtype=torch.float64)
    out, _, _ = layer(x, (3, 4))
    for b in range(3):
        single, _, _ = layer(x[b:b + 1], (3, 4))
        torch.testing.assert_close(single, out[b:b + 1])


def test_shared_assignment_is_required_without_clustering_module():
    layer = PaCaAttention(16, 2, num_clusters=4, clustering=None)
    with pytest.raises(RuntimeError, match='no clustering module'):
        layer(torch.randn(1, 6, 16), (2, 3))


def test_heads_must_divide_dim():
    with pytest.raises(ValueError, match='num_heads=3 does not divide dim=16'):
        PaCaAttention(16, 3, 4)


def test_one_cluster_is_still_clustering():
    """M = 1 is patch-to-cluster attention with a single cluster (only M = 0 is plain
    attention): the layer owns a clustering module and returns a (B, 1, N) assignment."""
    layer = PaCaAttention(8, 2, num_clusters=1, clustering='conv')
    assert hasattr(layer, 'cluster_norm') and layer.owns_clustering
    out, z, logits = layer(torch.randn(2, 12, 8), (3, 4))
    assert out.shape == (2, 12, 8) and z.shape == (2, 1, 12) and logits.shape == (2, 1, 12)
    torch.testing.assert_close(z.sum(-1), torch.ones(2, 1))
