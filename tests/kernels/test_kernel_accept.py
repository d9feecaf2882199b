"""Token acceptance kernels vs their torch references (same uniforms, same outputs) and their law."""

import pytest
import torch

from diffspec.kernels import inverse_cdf, rejection_sample, speculative_accept, warp_reference

triton = pytest.importorskip("triton")
stats = pytest.importorskip("scipy.stats")


def _close_pair(rows, vocab, seed, spread=0.5):
    """Target p and draft q close enough that some drafts are accepted and some rejected."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 2
    p = logits.softmax(-1)
    q = (logits + spread * torch.randn(rows, vocab, generator=g)).softmax(-1)
    return p, q, g


@pytest.mark.parametrize("vocab", [257, 4097])  # not powers of two; 4097 spans two vocab blocks
def test_rejection_sample_matches_reference(vocab):
    p, q, g = _close_pair(6, vocab, seed=vocab)
    q[1] = p[1]  # empty residual: the draw falls back to p
    p[2] = q[2] = torch.nn.functional.one_hot(torch.tensor(vocab - 1), vocab).float()  # forced token at the edge
    draft = torch.multinomial(q, 1, generator=g)[:, 0]
    draft[3] = vocab - 1
    ua, ur = torch.rand(6, generator=g), torch.rand(6, generator=g)
    draft[5], ua[5] = (p[5] / q[5]).argmin(), 0.999  # a sure rejection
    ref = rejection_sample(p, q, draft, ua, ur, backend="torch")
    out = rejection_sample(p, q, draft, ua, ur, backend="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert ref[0].any() and not ref[0].all()
    masses = (torch.rand(6, generator=g), torch.rand(6, generator=g))  # a relaxed rule's masses
    ref = rejection_sample(p, q, draft, ua, ur, accept_mass=masses, backend="torch")
    out = rejection_sample(p, q, draft, ua, ur, accept_mass=masses, backend="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("warp", [(1.0, 0, 1.0, torch.float32), (0.7, 37, 1.0, torch.bfloat16),
                                  (1.3, 0, 0.8, torch.float16), (0.9, 100, 0.9, torch.float32)])
def test_speculative_accept_matches_reference(warp):
    temperature, top_k, top_p, dtype = warp
    b, k, vocab = 2, 3, 1000
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(b, k + 1, vocab, generator=g) * 3
    logits[0, :, :10] = float("-inf")  # tokens removed by a logits processor
    logits = logits.to(dtype)
    noisy = logits.float() + 0.2 * torch.randn(b, k + 1, vocab, generator=g)
    q = warp_reference(noisy[:, :k], temperature, top_k, top_p)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(b, k)
    ua, ur = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    m_ref, tok_ref = speculative_accept(logits, drafts, q, ua, ur, backend="torch", **kw)
    m, tok = speculative_accept(logits, drafts, q, ua, ur, backend="triton", **kw)
    assert torch.equal(m, m_ref) and torch.equal(tok, tok_ref)
    p = warp_reference(logits, **kw)
    emitted = tok_ref.gather(1, m_ref[:, None])[:, 0]
    assert (p[torch.arange(b), m_ref, emitted] > 0).all()  # never a token the warpers removed


@pytest.mark.parametrize("case", [(999, 1.0, 0, 1.0, torch.float32), (999, 0.7, 37, 1.0, torch.bfloat16),
                                  (999, 1.3, 0, 0.8, torch.float16), (999, 0.9, 100, 0.9, torch.float32),
                                  (4097, 0.8, 0, 1.0, torch.float16)])  # 4097: two vocab blocks
def test_speculative_accept_draft_logits_equal_warped_probs(case):
    """Draft logits warped in the kernel: same outputs as the caller passing the warped probabilities."""
    vocab, temperature, top_k, top_p, dtype = case
    b, k = 3, 3
    g = torch.Generator().manual_seed(vocab + top_k)
    logits = (torch.randn(b, k + 1, vocab, generator=g) * 3).to(dtype)
    draft_logits = (logits[:, :k].float() + 0.4 * torch.randn(b, k, vocab, generator=g)).to(dtype)
    edge = min(vocab, 4096)
    draft_logits[0, :, edge - 3:edge + 1] = float("-inf")  # removed draft tokens across a block edge
    draft_logits[1, 1, :5] = float("-inf")
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    q = warp_reference(draft_logits, **kw)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(b, k)
    ua, ur = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    m_ref, tok_ref = speculative_accept(logits, drafts, q, ua, ur, backend="torch", **kw)
    for backend in ("torch", "triton"):
        m, tok = speculative_accept(logits, drafts, draft_logits, ua, ur, draft_logits=True, backend=backend, **kw)
        assert torch.equal(m, m_ref) and torch.equal(tok, tok_ref), backend
    assert 0 < m_ref.sum() < b * k  # acceptances and rejections both exercised
    p = warp_reference(logits, **kw)
    emitted = tok_ref.gather(1, m_ref[:, None])[:, 0]
    assert (p[torch.arange(b), m_ref, emitted] > 0).all()


def test_draft_logits_are_not_read_as_probabilities():
    """The flag matters: logits passed as probabilities give other decisions (the test can fail)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3, 61, generator=g) * 2
    draft_logits = logits[:, :2] + 0.5 * torch.randn(4, 2, 61, generator=g)
    drafts = torch.multinomial(draft_logits.softmax(-1).view(-1, 61), 1, generator=g).view(4, 2)
    ua, ur = torch.rand(4, 2, generator=g), torch.rand(4, 3, generator=g)
    right = speculative_accept(logits, drafts, draft_logits, ua, ur, draft_logits=True, backend="triton")
    wrong = speculative_accept(logits, drafts, draft_logits.exp(), ua, ur, backend="triton")  # unnormalised q
    assert not (torch.equal(right[0], wrong[0]) and torch.equal(right[1], wrong[1]))


def test_speculative_accept_all_accepted_draws_the_bonus():
    logits = torch.randn(1, 3, 50, generator=torch.Generator().manual_seed(0))
    p = logits.softmax(-1)
    drafts = torch.tensor([[4, 9]])
    ua, ur = torch.zeros(1, 2), torch.tensor([[0.5, 0.5, 0.3]])
    for backend in ("torch", "triton"):
        m, tok = speculative_accept(logits, drafts, p[:, :2], ua, ur, backend=backend)
        assert m.tolist() == [2] and tok[0, :2].tolist() == [4, 9]
        assert tok[0, 2] == inverse_cdf(p[0, 2], torch.tensor(0.3))


def _law_pvalue(tokens, law):
    support = law > 0
    counts = torch.bincount(tokens, minlength=law.numel())[support].double()
    law = law[support].double()
    expected = law / law.sum() * counts.sum()
    return stats.chisquare(counts.numpy(), expected.numpy()).pvalue


P = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.00, 0.0])
Q = torch.tensor([0.10, 0.10, 0.20, 0.20, 0.20, 0.15, 0.05])


@pytest.mark.parametrize("backend,n", [("torch", 20000), ("triton", 400)])
def test_output_law_is_the_target(backend, n):
    g = torch.Generator().manual_seed(11)
    p, q = P.expand(n, -1).contiguous(), Q.expand(n, -1).contiguous()
    draft = torch.multinomial(q, 1, generator=g)[:, 0]
    accepted, tokens = rejection_sample(p, q, draft, torch.rand(n, generator=g), torch.rand(n, generator=g),
                                        backend=backend)
    assert _law_pvalue(tokens, P) > 1e-3
    if backend == "torch":  # the residual draws alone follow normalise(max(0, p - q))
        residual = (P - Q).clamp_min(0)
        assert _law_pvalue(tokens[~accepted], residual / residual.sum()) > 1e-3


def test_law_check_detects_a_wrong_draft_law():
    """Planted bias: drafts from Q but tested as if from uniform; the same check must fail."""
    n = 20000
    g = torch.Generator().manual_seed(12)
    q = Q.expand(n, -1).contiguous()
    draft = torch.multinomial(q, 1, generator=g)[:, 0]
    wrong = torch.full_like(q, 1 / Q.numel())
    _, tokens = rejection_sample(P.expand(n, -1), wrong, draft, torch.rand(n, generator=g),
                                 torch.rand(n, generator=g), backend="torch")
    assert _law_pvalue(tokens, P) < 1e-6


def test_errors():
    with pytest.raises(ValueError, match="temperature"):
        speculative_accept(torch.zeros(1, 2, 4), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 4),
                           torch.zeros(1, 1), torch.zeros(1, 2), temperature=0.0)
    with pytest.raises(ValueError, match=r"\(B, K\+1, V\)"):
        speculative_accept(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 4),
                           torch.zeros(1, 1), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="rejection_sample"):
        rejection_sample(torch.zeros(2, 4), torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), torch.zeros(2),
                         torch.zeros(2))


@pytest.fixture
def split_path(monkeypatch):
    """Route the Triton calls through the vocab-split kernels (pieces of 256 tokens)."""
    from diffspec.kernels import _accept_triton

    monkeypatch.setattr(_accept_triton, "SPLIT", 256)
    calls = []
    from diffspec.kernels import _accept_split_triton

    original = _accept_split_triton.accept_rows_split
    monkeypatch.setattr(_accept_split_triton, "accept_rows_split", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@pytest.mark.parametrize("vocab", [1000, 4097])
def test_split_path_rejection_sample_matches_reference(split_path, vocab):
    p, q, g = _close_pair(5, vocab, seed=vocab + 1)
    q[1] = p[1]
    draft = torch.multinomial(q, 1, generator=g)[:, 0]
    ua, ur = torch.rand(5, generator=g), torch.rand(5, generator=g)
    draft[4], ua[4] = (p[4] / q[4]).argmin(), 0.999
    masses = None if vocab == 1000 else (torch.rand(5, generator=g) * torch.tensor([1.0, 1, 1, 1, 0]),
                                         torch.rand(5, generator=g))  # row 4: zero mass, a sure rejection
    ref = rejection_sample(p, q, draft, ua, ur, accept_mass=masses, backend="torch")
    out = rejection_sample(p, q, draft, ua, ur, accept_mass=masses, backend="triton")
    assert split_path and torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert not ref[0].all()


def test_split_path_speculative_accept_matches_reference(split_path):
    b, k, vocab = 3, 4, 1000
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(b, k + 1, vocab, generator=g) * 3
    logits[0, :, :7] = float("-inf")
    q = (logits[:, :k] / 0.8 + 0.3 * torch.randn(b, k, vocab, generator=g)).softmax(-1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(b, k)
    ua, ur = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    m_ref, tok_ref = speculative_accept(logits, drafts, q, ua, ur, temperature=0.8, backend="torch")
    m, tok = speculative_accept(logits, drafts, q, ua, ur, temperature=0.8, backend="triton")
    assert split_path and torch.equal(m, m_ref) and torch.equal(tok, tok_ref)
    assert 0 < m_ref.sum() < b * k


@pytest.mark.parametrize("vocab", [1000, 1283])  # 1283: a last piece of 3 tokens
def test_split_path_draft_logits_equal_warped_probs(split_path, vocab):
    b, k = 2, 3
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(b, k + 1, vocab, generator=g) * 3
    draft_logits = logits[:, :k] + 1.0 * torch.randn(b, k, vocab, generator=g)
    draft_logits[0, :, 254:258] = float("-inf")  # removed draft tokens across a piece edge
    draft_logits[1, 0, 256:512] = float("-inf")  # a whole removed piece
    logits[0, :, 512:768] = float("-inf")  # a whole piece removed from the target too
    q = warp_reference(draft_logits, 0.8)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(b, k)
    ua, ur = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    m_ref, tok_ref = speculative_accept(logits, drafts, q, ua, ur, temperature=0.8, backend="torch")
    m, tok = speculative_accept(logits, drafts, draft_logits, ua, ur, temperature=0.8, draft_logits=True,
                                backend="triton")
    assert split_path and torch.equal(m, m_ref) and torch.equal(tok, tok_ref)
    assert 0 < m_ref.sum() < b * k
