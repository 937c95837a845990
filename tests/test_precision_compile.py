"""AMP precision of the backbone, and torch.compile compatibility (no graph breaks)."""
import pytest
import torch

from paca_mm.models.backbones import PaCaViT
from paca_mm.models.layers import PaCaAttention

SMALL_ARCH = dict(embed_dims=(32, 64, 96, 128), depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8))


def _cpu_autocast_dtypes():
    """The half types CPU autocast offers on this torch: bf16 always; fp16 from torch 2.2
    on (torch 2.1 raises 'AutocastCPU only support Bfloat16'). fp16 is what GPU runs use;
    where CPU autocast lacks it, the fp16 cases do not exist rather than being skipped."""
    out = [torch.bfloat16]
    try:
        with torch.autocast('cpu', dtype=torch.float16):
            pass
        out.append(torch.float16)
    except RuntimeError:
        pass
    return out


CPU_AMP = _cpu_autocast_dtypes()
_NAMES = {torch.bfloat16: 'bf16', torch.float16: 'fp16'}
AMP_DTYPES = pytest.mark.parametrize('dtype', CPU_AMP, ids=[_NAMES[d] for d in CPU_AMP])
_TOL = {torch.bfloat16: 0.05, torch.float16: 0.01}


@AMP_DTYPES
def test_cluster_softmax_is_float32_under_autocast(dtype):
    layer = PaCaAttention(32, 2, num_clusters=6, clustering='conv')
    x = torch.randn(1, 40 * 40, 32)
    with torch.autocast('cpu', dtype=dtype):
        out, z, logits = layer(x, (40, 40))
    assert logits.dtype == dtype           # the conv ran in half precision
    assert z.dtype == torch.float32        # but the long softmax did not
    torch.testing.assert_close(z.sum(-1), torch.ones(1, 6))


@pytest.mark.parametrize('dtype,tol', [(d, _TOL[d]) for d in CPU_AMP],
                         ids=[_NAMES[d] for d in CPU_AMP])
def test_autocast_close_to_fp32(dtype, tol):
    torch.manual_seed(0)
    model = PaCaViT(arch=SMALL_ARCH, num_clusters=(8, 8, 8, 0)).eval()
    x = torch.randn(1, 3, 128, 160)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast('cpu', dtype=dtype):
            amp = model(x)
    for r, a in zip(ref, amp):
        assert torch.isfinite(a).all()
        # outputs are LayerNorm-ed (unit scale): bf16 has ~3 significant digits, fp16 ~4
        rel = ((a.float() - r).norm() / r.norm()).item()
        assert rel < tol, rel


@pytest.mark.slow
@AMP_DTYPES
def test_amp_at_1024_has_no_nan_or_inf(dtype):
    model = PaCaViT(arch='tiny').eval()
    with torch.inference_mode(), torch.autocast('cpu', dtype=dtype):
        outs = model(torch.randn(1, 3, 1024, 1024))
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('teacher', [False, True])
def test_no_graph_breaks_under_torch_compile(teacher):
    import torch._dynamo as dynamo
    model = PaCaViT(arch=SMALL_ARCH, num_clusters=(4, 4, 4, 4 if teacher else 0),
                    teacher=dict(depths=(1,) * 4) if teacher else False).eval()
    dynamo.reset()
    explanation = dynamo.explain(model)(torch.randn(1, 3, 64, 64))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
