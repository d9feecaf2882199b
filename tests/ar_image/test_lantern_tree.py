"""LANTERN++ static trees: layout, tree attention + KV commit, chain reproduction, greedy and law exactness."""

from __future__ import annotations

import itertools

import pytest
import torch
from ar_checks import chi2_fit

from diffspec import SpeculativePipeline
from diffspec.ar_image.drafter import EagleDrafter, FeatureDrafter
from diffspec.ar_image.lantern import lantern_sample
from diffspec.ar_image.lantern_config import LanternPPConfig
from diffspec.ar_image.lantern_tree import lantern_tree_sample
from diffspec.ar_image.neighbours import latent_neighbours
from diffspec.ar_image.targets.llamagen import LlamaGenConfig, LlamaGenTransformer
from diffspec.ar_image.targets.llamagen_session import LlamaGenTarget
from diffspec.ar_image.tree import StaticTree
from diffspec.speculation.sampling import warp
from diffspec.stats import SpecStats

GUIDANCE = 2.0


class _Codes:
    """A decoder stand-in carrying only a codebook."""

    def __init__(self, vocab: int) -> None:
        self.codebook = torch.randn(vocab, 3, generator=torch.Generator().manual_seed(5))


def _randomise(module: torch.nn.Module, seed: int, scale: float) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module.eval()


def _pair(vocab: int, block: int, scale: float = 0.7) -> tuple[LlamaGenTarget, FeatureDrafter]:
    cfg = LlamaGenConfig(dim=16, n_layer=2, n_head=2, vocab_size=vocab, num_classes=3, block_size=block)
    model = _randomise(LlamaGenTransformer(cfg), 0, scale)
    target = LlamaGenTarget(model, _Codes(vocab), default_guidance_scale=GUIDANCE)
    return target, FeatureDrafter(_randomise(EagleDrafter(cfg), 1, scale), model)


@pytest.fixture(scope="module")
def mid() -> tuple[LlamaGenTarget, FeatureDrafter]:
    """A 4x4-token, 16-code random LlamaGen and a random drafter."""
    return _pair(16, 16)


@pytest.fixture(scope="module")
def small() -> tuple[LlamaGenTarget, FeatureDrafter]:
    """A 2x2-token, 4-code random LlamaGen: its full joint law is enumerable."""
    return _pair(4, 4)


def _tree_tokens(target, head, tree, delta, lam, labels, seed, temperature=1.0, stats=None):
    session = target.start(class_labels=labels, guidance_scale=GUIDANCE)
    nb = latent_neighbours(target.codebook, 3)
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(labels))]
    with torch.no_grad():
        return lantern_tree_sample(session, target.num_tokens, head, nb, StaticTree(tree), delta, lam,
                                   {"temperature": temperature}, gens, stats)


def test_static_tree_layout() -> None:
    tree = StaticTree((2, 3, 1))
    assert tree.level_sizes == [2, 6, 6] and tree.offsets == [0, 2, 8] and tree.size == 14
    depth, parent, anc = tree.layout("cpu")
    assert depth.tolist() == [1] * 2 + [2] * 6 + [3] * 6
    assert parent.tolist() == [-1, -1, 0, 0, 0, 1, 1, 1, 2, 3, 4, 5, 6, 7]
    assert anc[12].nonzero().flatten().tolist() == [1, 6, 12]  # node 12: child of 6, grandchild of 1
    assert int(anc.sum()) == 2 + 6 * 2 + 6 * 3
    with pytest.raises(ValueError, match="branching"):
        StaticTree((2, 0))


def test_tree_attention_and_commit_match_a_chain(mid) -> None:
    target, _ = mid
    tree = StaticTree((2, 2))
    depth, _, anc = tree.layout("cpu")
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 16, (2, 5), generator=g)
    nodes = torch.randint(0, 16, (2, tree.size), generator=g)
    start = torch.tensor([4, 2])
    with torch.no_grad():
        s = target.start(class_labels=[1, 2], guidance_scale=GUIDANCE)
        s.step(prefix, torch.zeros(2, dtype=torch.long))
        s.step(torch.randint(0, 16, (2, 3), generator=g), start + 1)  # stale slots past the prefix
        got = s.step_tree(prefix.gather(1, start[:, None]).squeeze(1), start, nodes, depth, anc)
        path = torch.tensor([[1, 4], [0, 3]])  # node 4 is a child of node 1, node 3 of node 0
        s.commit_tree(start, path)
        after = s.step(nodes.gather(1, path[:, 1:]), start + 2)
        for b in range(2):  # reference: a fresh session fed the prefix and the path as a chain
            ref_s = target.start(class_labels=[[1, 2][b]], guidance_scale=GUIDANCE)
            seq = torch.cat([prefix[b, : start[b] + 1], nodes[b, path[b]]])[None]
            ref = ref_s.step(seq, torch.zeros(1, dtype=torch.long))[0, start[b]:]
            assert torch.allclose(got[b, 0], ref[0], atol=1e-4)
            assert torch.allclose(got[b, 1 + path[b, 0]], ref[1], atol=1e-4)
            assert torch.allclose(got[b, 1 + path[b, 1]], ref[2], atol=1e-4)
            assert torch.allclose(after[b, 0], ref[2], atol=1e-4)  # committed KV is the path's
        sibling = int(path[0, 0] ^ 1)
        assert not torch.allclose(got[0, 1 + sibling], got[0, 1 + path[0, 0]], atol=1e-3)


def test_all_ones_tree_is_the_chain_draw_for_draw(mid) -> None:
    target, head = mid
    labels = [0, 1, 2, 0, 1, 2]
    session = target.start(class_labels=labels, guidance_scale=GUIDANCE)
    nb = latent_neighbours(target.codebook, 3)
    with torch.no_grad():
        chain = lantern_sample(session, target.num_tokens, head, nb, 3, 0.3, 2.0, {"temperature": 1.0},
                               [torch.Generator().manual_seed(i) for i in range(6)])
    tree = _tree_tokens(target, head, (1, 1, 1), 0.3, 2.0, labels, 0)
    assert torch.equal(tree, chain)
    other = _tree_tokens(target, head, (2, 1, 1), 0.3, 2.0, labels, 0)
    assert not torch.equal(other, chain)  # siblings change the draws: the comparison can fail


@pytest.mark.parametrize("tree", [(3, 2, 1), (2, 2, 2, 2)])
def test_greedy_tree_equals_plain_greedy(mid, tree) -> None:
    target, head = mid
    labels = [0, 1, 2, 2, 1]
    plain = target.generate(class_labels=labels, guidance_scale=GUIDANCE, temperature=0)
    stats = SpecStats(method="lantern++")
    got = _tree_tokens(target, head, tree, 0.0, None, labels, 0, temperature=0.0, stats=stats)
    assert torch.equal(got, plain)
    assert stats.target_calls < 1 + target.num_tokens and stats.extra["tree_nodes"] == StaticTree(tree).size


def _exact_law(target: LlamaGenTarget, label: int) -> torch.Tensor:
    seqs = torch.tensor(list(itertools.product(range(4), repeat=target.num_tokens)))
    session = target.start(class_labels=[label] * len(seqs), guidance_scale=GUIDANCE)
    with torch.no_grad():
        logits = torch.cat([session.first_logits[:, None],
                            session.step(seqs[:, :-1], torch.zeros(len(seqs), dtype=torch.long))], 1)
    return warp(logits).gather(-1, seqs[..., None]).squeeze(-1).prod(1).double()


def test_tree_delta_zero_is_exact_and_relaxation_is_detected(small) -> None:
    target, head = small
    law = _exact_law(target, 1)
    index = 4 ** torch.arange(target.num_tokens - 1, -1, -1)
    n = 3000
    session = target.start(class_labels=[1] * n, guidance_scale=GUIDANCE)
    nb = latent_neighbours(target.codebook, 3)
    with torch.no_grad():
        exact = lantern_tree_sample(session, 4, head, nb, StaticTree((3, 2)), 0.0, None, {"temperature": 1.0},
                                    torch.Generator().manual_seed(0))
        session = target.start(class_labels=[1] * n, guidance_scale=GUIDANCE)
        relaxed = lantern_tree_sample(session, 4, head, nb, StaticTree((3, 2)), 0.6, None, {"temperature": 1.0},
                                      torch.Generator().manual_seed(1))
    assert chi2_fit((exact * index).sum(1), law)[2] > 1e-3
    assert chi2_fit((relaxed * index).sum(1), law)[2] < 1e-6


def test_config_and_pipeline_routing(mid, tmp_path) -> None:
    target, head = mid
    assert LanternPPConfig().tree == (4, 2, 2, 1, 1)
    for bad in ((2, 0), (65,), "abc", (8,) * 4):
        with pytest.raises(ValueError, match="tree"):
            LanternPPConfig(tree=bad)
    head.drafter.save_pretrained(tmp_path / "d")
    outs = {}
    for tree in ((), (1, 1, 1, 1), (2, 2, 1)):
        spec = SpeculativePipeline.from_pipe(target, method="lantern++", drafter=str(tmp_path / "d"), tree=tree)
        spec.set_progress_bar_config(disable=True)
        gens = [torch.Generator().manual_seed(i) for i in range(3)]
        outs[tree] = spec(class_labels=[0, 1, 2], output_type="tokens", generator=gens).tokens
        assert spec.stats.draft_calls > 0 and 0 <= spec.stats.accepted <= spec.stats.proposed
    assert torch.equal(outs[()], outs[(1, 1, 1, 1)])  # () = chain of draft_length 4
    assert spec.stats.extra["tree_nodes"] == 10  # (2, 2, 1): 2 + 4 + 4 nodes
