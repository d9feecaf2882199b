"""Compiled Triton kernels vs their references on CUDA at real sizes (skipped without CUDA)."""

import pytest
import torch

from diffspec import kernels
from diffspec.kernels.accept import warp_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_triton():
    pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_forecast_flux_size(dtype):
    g = torch.Generator("cuda").manual_seed(0)
    anchors = [torch.randn(2, 4096, 3072, device="cuda", generator=g).to(dtype) for _ in range(3)]
    true = torch.randn(2, 4096, 3072, device="cuda", generator=g).to(dtype)
    assert kernels.use_triton(anchors, None)
    out = kernels.forecast(anchors, [1.0, -3.0, 3.0], true=true)
    ref = kernels.forecast(anchors, [1.0, -3.0, 3.0], true=true, backend="torch")
    torch.testing.assert_close(out[0], ref[0], rtol=1e-6, atol=1e-5)
    for o, r in zip(out[1:], ref[1:]):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=0.0)


def test_coupling_latent_size():
    g = torch.Generator("cuda").manual_seed(1)
    k, shape = 8, (8, 16, 128, 128)
    a = torch.randn(shape, device="cuda", generator=g)
    b = a + torch.linspace(0, 0.01, k, device="cuda").view(k, 1, 1, 1) * torch.randn(shape, device="cuda", generator=g)
    z = torch.randn(shape, device="cuda", generator=g)
    s = torch.rand(k, device="cuda", generator=g) + 0.5
    args = (a + s.view(k, 1, 1, 1) * z, z, a, b, s, torch.rand(k, device="cuda", generator=g))
    out, ref = kernels.reflection_coupling(*args), kernels.reflection_coupling(*args, backend="torch")
    assert torch.equal(out.accepted, ref.accepted)
    torch.testing.assert_close(out.sample, ref.sample, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("warp", [(1.0, 0, 1.0), (0.8, 50, 0.9)])
@pytest.mark.parametrize("vocab,k,batch", [(16384, 4, 8), (151936, 8, 2)])
def test_accept_vocab_sizes(vocab, k, batch, warp):
    g = torch.Generator("cuda").manual_seed(vocab)
    temperature, top_k, top_p = warp
    logits = torch.randn(batch, k + 1, vocab, device="cuda", generator=g) * 2
    q = warp_reference(logits[:, :k] + 0.3 * torch.randn(batch, k, vocab, device="cuda", generator=g), *warp)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(batch, k)
    ua = torch.rand(batch, k, device="cuda", generator=g)
    ur = torch.rand(batch, k + 1, device="cuda", generator=g)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    m, tok = kernels.speculative_accept(logits, drafts, q, ua, ur, **kw)
    m_ref, tok_ref = kernels.speculative_accept(logits, drafts, q, ua, ur, backend="torch", **kw)
    # GPU cumsum / exp round differently from the kernel's block sums: allow a rare boundary flip
    same = (m == m_ref) & (tok == tok_ref).all(1)
    assert same.float().mean() >= 0.9, (m, m_ref)


@pytest.mark.parametrize("warp", [(1.0, 0, 1.0), (0.8, 50, 0.9)])
@pytest.mark.parametrize("vocab,k,batch", [(16384, 4, 8), (151936, 8, 2)])  # 151936 at batch 2: the split path
def test_accept_draft_logits_vocab_sizes(vocab, k, batch, warp):
    g = torch.Generator("cuda").manual_seed(vocab + 1)
    logits = torch.randn(batch, k + 1, vocab, device="cuda", generator=g) * 2
    draft_logits = logits[:, :k] + 0.3 * torch.randn(batch, k, vocab, device="cuda", generator=g)
    q = warp_reference(draft_logits, *warp)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(batch, k)
    ua = torch.rand(batch, k, device="cuda", generator=g)
    ur = torch.rand(batch, k + 1, device="cuda", generator=g)
    kw = dict(temperature=warp[0], top_k=warp[1], top_p=warp[2])
    m, tok = kernels.speculative_accept(logits, drafts, draft_logits, ua, ur, draft_logits=True, **kw)
    m_ref, tok_ref = kernels.speculative_accept(logits, drafts, q, ua, ur, backend="torch", **kw)
    same = (m == m_ref) & (tok == tok_ref).all(1)  # rounding boundary flips allowed, rarely
    assert same.float().mean() >= 0.9, (m, m_ref)


@pytest.mark.parametrize("vocab", [32064, 151936])
def test_tolerance_rules_vocab_sizes(vocab):
    g = torch.Generator("cuda").manual_seed(vocab)
    x = torch.randn(16, 8, vocab, device="cuda", generator=g).to(torch.bfloat16)
    t = x.float().argmax(-1)
    drafts = (t + torch.randint(-4, 5, t.shape, device="cuda", generator=g)).clamp(0, vocab - 1)
    kw = dict(first_id=vocab - 256, n_bins=256, reverse=True, tolerance=3)
    out, ref = kernels.bin_tolerance(x, drafts, **kw), kernels.bin_tolerance(x, drafts, backend="torch", **kw)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    relaxed = torch.arange(16, device="cuda") % 4 != 0
    out = kernels.beta_tolerance(x, drafts[:, :7], beta=0.3, relaxed=relaxed)
    ref = kernels.beta_tolerance(x, drafts[:, :7], beta=0.3, relaxed=relaxed, backend="torch")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
