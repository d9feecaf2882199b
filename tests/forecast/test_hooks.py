import pytest
import torch

from diffspec.config import ForecastConfig
from diffspec.forecast.blocks import find_block_lists
from diffspec.forecast.gate import Schedule
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.steps import StepTracker
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import TINY_MODELS, build_transformer, make_call, timesteps_for

MODELS = list(TINY_MODELS)


def _loop(model, x0, call, ts, on_step=None):
    x = x0.clone()
    with torch.no_grad():
        for i, t in enumerate(ts):
            if on_step:
                on_step(i)
            x = x - 0.05 * call(model, x, t)
    return x


def _count_block_internals(model):
    """Counts forward calls of the attention / feed-forward modules inside the transformer blocks.

    (DiT reuses block 0's conditioning embedder after the blocks, so embedders are not counted.)
    """
    calls = {"n": 0}

    def hook(*_):
        calls["n"] += 1

    for _, blocks in find_block_lists(model):
        for block in blocks:
            for sub in block.modules():
                if sub is not block and any(k in type(sub).__name__ for k in ("Attention", "FeedForward")):
                    sub.register_forward_pre_hook(hook)
    return calls


@pytest.mark.parametrize("name", MODELS)
def test_forecast_steps_run_no_block_and_detach_restores(name):
    model = build_transformer(name)
    x0, call = make_call(name, batch=2)
    ts = timesteps_for(name, 20)
    baseline = _loop(model, x0, call, ts)

    stats = SpecStats()
    hooks = ForecastHooks(model, ForecastConfig(), stats, num_steps_fn=lambda: 20)
    hooks.attach()
    calls = _count_block_internals(model)
    per_step = []

    def on_step(i):
        per_step.append(calls["n"])

    out = _loop(model, x0, call, ts, on_step)
    per_step.append(calls["n"])
    ran = [b - a for a, b in zip(per_step, per_step[1:])]
    expected_full = Schedule.of(ForecastConfig()).without_rejections(20)
    assert [i for i, f in enumerate(expected_full) if f] == [0, 1, 2, 7, 12, 17, 19]
    assert [r > 0 for r in ran] == expected_full  # forecast steps run no module inside any block
    assert stats.full_steps == sum(expected_full) == 7 and stats.forecast_steps == 13
    assert stats.target_calls == 7 and stats.draft_calls == 13
    assert torch.isfinite(out).all()
    rel = (out - baseline).norm() / baseline.norm()
    assert 0 < rel < 0.2, rel  # forecast, not a copy of the baseline, and close to it

    hooks.detach()
    assert torch.equal(_loop(model, x0, call, ts), baseline)


@pytest.mark.parametrize("name", MODELS)
def test_interval_one_is_bit_identical_to_baseline(name):
    model = build_transformer(name)
    x0, call = make_call(name, batch=1)
    ts = timesteps_for(name, 8)
    baseline = _loop(model, x0, call, ts)
    hooks = ForecastHooks(model, ForecastConfig(interval=1), SpecStats())
    hooks.attach()
    assert torch.equal(_loop(model, x0, call, ts), baseline)
    hooks.detach()


@pytest.mark.parametrize("form,abscissa,order", [("newton", "sigma", 2), ("taylor", "index", 2), ("newton", "index", 0)])
def test_forecast_variants_run(form, abscissa, order):
    model = build_transformer("tiny-dit-random")
    x0, call = make_call("tiny-dit-random", batch=1)
    ts = timesteps_for("tiny-dit-random", 16)
    baseline = _loop(model, x0, call, ts)
    cfg = ForecastConfig(order=order, form=form, abscissa=abscissa, interval=3)
    hooks = ForecastHooks(model, cfg, SpecStats(), num_steps_fn=lambda: 16)
    hooks.attach()
    out = _loop(model, x0, call, ts)
    assert torch.isfinite(out).all() and not torch.equal(out, baseline)
    assert (out - baseline).norm() / baseline.norm() < 0.2


def test_separate_cfg_branches_keep_their_own_anchors():
    """Two calls per step with the same timestep = two branches, each forecast from its own history."""
    name = "tiny-dit-random"
    model = build_transformer(name)
    xa, call = make_call(name, batch=1, seed=1)
    xb = xa.flip(-1) * 2.0
    ts = timesteps_for(name, 12)

    def run(branches, hooks):
        xs = [x.clone() for x in branches]
        with torch.no_grad():
            for t in ts:
                xs = [x - 0.05 * call(model, x, t) for x in xs]
        hooks.reset()
        return xs

    hooks = ForecastHooks(model, ForecastConfig(interval=3), SpecStats(), num_steps_fn=lambda: 12)
    hooks.attach()
    both = run([xa, xb], hooks)
    only_a = run([xa], hooks)
    only_b = run([xb], hooks)
    assert torch.equal(both[0], only_a[0]) and torch.equal(both[1], only_b[0])


def test_token_count_change_resets_instead_of_crashing():
    name = "tiny-dit-random"
    model = build_transformer(name)
    x0, call = make_call(name, batch=1)
    stats = SpecStats()
    hooks = ForecastHooks(model, ForecastConfig(warmup=1, interval=4), stats)
    hooks.attach()
    ts = timesteps_for(name, 10)
    with torch.no_grad():
        for i, t in enumerate(ts):
            x = x0 if i < 4 else torch.nn.functional.interpolate(x0, scale_factor=2)  # token count changes
            out = call(model, x, t)
            assert out.shape[-1] == x.shape[-1]
    assert stats.full_steps >= 2 and stats.forecast_steps >= 1


def test_text_token_count_change_resets_instead_of_crashing():
    """Bria FIBO 2.0 switches to longer prompt embeddings in mid-generation (images of the caption's text): more
    gist tokens run through its main layers, at the same latent shape."""
    name = "tiny-briafibo2"
    model = build_transformer(name)
    x, _ = make_call(name, batch=1)
    short, long = torch.randn(1, 3, 5, 24), torch.randn(1, 3, 12, 24)  # 4 then 8 gist tokens
    hooks = ForecastHooks(model, ForecastConfig(), SpecStats(), num_steps_fn=lambda: 20)
    hooks.attach()
    modes = []
    with torch.no_grad():
        for i, t in enumerate(timesteps_for(name, 20)):
            text = short if i < 9 else long
            x = x - 0.05 * model(hidden_states=x, timestep=t.expand(1), encoder_hidden_states=text, return_dict=False)[0]
            modes.append(hooks.call.mode)
    assert torch.isfinite(x).all()
    assert modes[8] == "draft" and modes[9] == "full" and "draft" in modes[10:]  # the branch restarted at the switch


def test_new_generation_detected_from_timestep_increase():
    tracker = StepTracker()
    seen = [(tracker.observe(t), tracker.step, tracker.branch) for t in [999, 999, 500, 500, 1, 999, 500]]
    assert seen == [(True, 0, 0), (False, 0, 1), (False, 1, 0), (False, 1, 1), (False, 2, 0), (True, 0, 0),
                    (False, 1, 0)]


def test_increasing_timesteps_start_a_generation_on_decrease():
    """Lumina2 / Z-Image pipelines pass 1 - sigma: the timestep grows over a generation."""
    tracker = StepTracker(increasing=True)
    seen = [(tracker.observe(t), tracker.step, tracker.branch) for t in [0.0, 0.0, 0.5, 0.9, 0.0, 0.5]]
    assert seen == [(True, 0, 0), (False, 0, 1), (False, 1, 0), (False, 2, 0), (True, 0, 0), (False, 1, 0)]


def test_missing_timestep_is_a_clear_error():
    model = build_transformer("tiny-dit-random")
    hooks = ForecastHooks(model, ForecastConfig(), SpecStats())
    hooks.attach()
    with pytest.raises(ValueError, match="timestep"):
        model(torch.zeros(1, 4, 8, 8), class_labels=torch.tensor([0]))


def test_unknown_architecture_names_supported():
    with pytest.raises(ValueError, match="DiTTransformer2DModel"):
        find_block_lists(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_blocks_named_in_the_config_are_used_and_bad_names_listed():
    model = build_transformer("tiny-flux-random")
    x0, call = make_call("tiny-flux-random", batch=1)
    ts = timesteps_for("tiny-flux-random", 12)
    only_double = ForecastHooks(model, ForecastConfig(blocks=("transformer_blocks",)), SpecStats(), lambda: 12)
    assert [n for n, _ in only_double.block_lists] == ["transformer_blocks"]
    calls = {"single": 0}
    model.single_transformer_blocks[0].register_forward_pre_hook(lambda *_: calls.__setitem__("single", calls["single"] + 1))
    only_double.attach()
    out = _loop(model, x0, call, ts)
    only_double.detach()
    assert calls["single"] == 12 and torch.isfinite(out).all()  # the single blocks ran on every step
    with pytest.raises(ValueError, match=r"no non-empty nn.ModuleList named 'blocks'; its ModuleLists: transformer_blocks"):
        ForecastHooks(model, ForecastConfig(blocks=("blocks",)), SpecStats())
    with pytest.raises(ValueError, match=r"blocks=\(\) must be a non-empty tuple"):
        ForecastConfig(blocks=())
    assert ForecastConfig(blocks="transformer_blocks").blocks == ("transformer_blocks",)


def test_unknown_architecture_says_what_to_pass():
    with pytest.raises(ValueError, match=r"Pass blocks=\('name', ...\)"):
        find_block_lists(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_side_output_lists_are_skipped_on_drafts_and_cache_nothing():
    """Wan VACE's control blocks feed only hints, which the main list's residual carries: nothing of theirs is
    forecast or cached, and a draft step runs none of their modules (the main list is forecast as usual)."""
    name = "tiny-wanvace"
    model = build_transformer(name)
    x0, call = make_call(name, batch=2)
    hooks = ForecastHooks(model, ForecastConfig(order=2, interval=4, warmup=2), SpecStats(), num_steps_fn=lambda: 12)
    hooks.attach()
    out = _loop(model, x0, call, timesteps_for(name, 12))
    names = [n for n, _ in hooks.block_lists]
    assert names == ["vace_blocks", "blocks"]
    side, main = hooks.call.branch.lists
    assert not side.forecasters and main.forecasters
    assert hooks.stats.forecast_steps > 0 and torch.isfinite(out).all()


def test_modules_between_blocks_are_zero_on_drafts(override_profile):
    """ConsisID adds a face perceiver cross-attention's output to the stream after every other block, outside the
    blocks. The list's residual already carries it: on a draft none runs (adding it again would count it twice),
    and detaching restores them."""
    name = "tiny-consisid"
    model = build_transformer(name)
    x0, call = make_call(name, batch=2)
    ts = timesteps_for(name, 20)
    baseline = _loop(model, x0, call, ts)
    ran = {"n": 0}
    for module in model.perceiver_cross_attention:
        module.to_q.register_forward_pre_hook(lambda *_: ran.__setitem__("n", ran["n"] + 1))

    def run():
        hooks = ForecastHooks(model, ForecastConfig(), SpecStats(), num_steps_fn=lambda: 20)
        hooks.attach()
        out = _loop(model, x0, call, ts)
        hooks.detach()
        return out, hooks.stats

    out, stats = run()
    assert stats.forecast_steps > 0 and ran["n"] == len(model.perceiver_cross_attention) * stats.full_steps
    rel = (out - baseline).norm() / baseline.norm()
    override_profile(model, interleaved_modules=())
    twice, _ = run()  # the modules run on drafts too, on top of the forecast
    assert rel < 0.5 * (twice - baseline).norm() / baseline.norm()
    ran["n"] = 0
    assert torch.equal(_loop(model, x0, call, ts), baseline) and ran["n"] == 2 * len(ts)


def test_per_token_timesteps_with_a_clean_conditioning_frame_are_tracked():
    """Wan 2.2 TI2V / LTX image-to-video pass one timestep per token, 0 on the conditioning frame's tokens: the
    step is read from the noisiest token, so the run is forecast exactly as with one timestep per row."""
    tracker = StepTracker()
    per_token = [torch.tensor([[0.0, 0.0, t, t]]) for t in (999.0, 999.0, 500.0)]
    assert [(tracker.observe(tracker.read(t)), tracker.step, tracker.branch) for t in per_token] == [
        (True, 0, 0), (False, 0, 1), (False, 1, 0)]

    name = "tiny-wan"
    x0, _ = make_call(name, batch=2)
    text = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(0))
    ts = timesteps_for(name, 12)
    tokens = x0.shape[2] * (x0.shape[3] // 2) * (x0.shape[4] // 2)  # frames x patches (patch 1x2x2)
    first_frame = torch.arange(tokens) < tokens // x0.shape[2]

    def per_row(model, x, t):
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text, return_dict=False)[0]

    def per_token(model, x, t):
        timestep = torch.where(first_frame, 0.0, t).expand(x.shape[0], tokens)
        return model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]

    runs = []
    for call in (per_row, per_token):
        model = build_transformer(name)
        stats = SpecStats()
        ForecastHooks(model, ForecastConfig(interval=4, warmup=2), stats, num_steps_fn=lambda: 12).attach()
        out = _loop(model, x0, call, ts)
        assert torch.isfinite(out).all()
        runs.append((stats.full_steps, stats.forecast_steps))
    full = sum(Schedule(2, 4).without_rejections(12))
    assert runs[1] == runs[0] == (full, 12 - full)


def test_interleaved_modules_add_nothing_on_drafts():
    """Wan-Animate's face adapters run between blocks and add to the stream: a draft runs none of them inside the
    forecast list (its residual carries them), and the forecast stays close to the baseline; detach restores them."""
    name = "tiny-wananimate"
    model = build_transformer(name)
    x0, call = make_call(name, batch=2)
    ts = timesteps_for(name, 12)
    baseline = _loop(model, x0, call, ts)
    hooks = ForecastHooks(model, ForecastConfig(interval=4, warmup=2), SpecStats(), num_steps_fn=lambda: 12)
    hooks.attach()
    calls = {"n": 0}
    for adapter in model.face_adapter:
        adapter.to_q.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    out = _loop(model, x0, call, ts)
    assert calls["n"] == len(model.face_adapter) * hooks.stats.full_steps and hooks.stats.forecast_steps > 0
    assert (out - baseline).norm() / baseline.norm() < 0.02  # 0.07 when the adapters add to a draft again
    hooks.detach()
    assert torch.equal(_loop(model, x0, call, ts), baseline)


def test_nested_block_lists_by_dotted_name_flux3_image_to_image():
    """FLUX.3 keeps its image mode lists in a ModuleDict (``mode_blocks.image``): they are found by dotted name, in
    execution order, and the reference-image list (image-to-image only) is forecast too."""
    name = "tiny-flux3"
    model = build_transformer(name)
    assert [n for n, _ in find_block_lists(model)] == ["txt_mode_blocks", "mode_blocks.image",
                                                       "mode_blocks.image_cond", "single_transformer_blocks"]
    x0, _ = make_call(name, batch=2)
    g = torch.Generator().manual_seed(1)
    text, cond = torch.randn(2, 6, 24, generator=g), torch.randn(2, 4, 16, generator=g)  # a 2x2-token reference

    def ids(h: int, w: int, layer: int) -> torch.Tensor:  # (t, h, w, l) position ids
        return torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(layer, layer + 1)).float()

    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(6)).float()

    def i2i(model, x, t):
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text, img_ids=ids(4, 4, 0),
                     txt_ids=txt_ids, image_cond_hidden_states=cond, image_cond_ids=ids(2, 2, -1), return_dict=False)[0]

    ts = timesteps_for(name, 12)
    baseline = _loop(model, x0, i2i, ts)
    hooks = ForecastHooks(model, ForecastConfig(interval=3, warmup=2), SpecStats(), num_steps_fn=lambda: 12)
    hooks.attach()
    runs = {"n": 0}
    model.mode_blocks["image_cond"][0].attn.register_forward_pre_hook(lambda *_: runs.__setitem__("n", runs["n"] + 1))
    out = _loop(model, x0, i2i, ts)
    assert hooks.stats.forecast_steps > 0 and runs["n"] == hooks.stats.full_steps  # the reference list is skipped too
    rel = (out - baseline).norm() / baseline.norm()
    assert torch.isfinite(out).all() and 0 < rel < 0.2, rel
    hooks.detach()



def test_qwenimage21_prefix_kv_cache_is_refused_with_the_reason():
    """Qwen-Image 2.1's prefix KV cache (its pipeline's default) shrinks the blocks' stream after step 0 and holds
    every row's prefix: the hooks refuse it and say how to call the pipeline instead."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    model = build_transformer("tiny-qwenimage21")
    ForecastHooks(model, ForecastConfig(), SpecStats()).attach()
    img_mask = torch.tensor([[False] * 6 + [True] * 4])  # 6 text tokens, 4 slots of 2x2 target tokens
    kwargs = dict(hidden_states=torch.randn(1, 16, 4), encoder_hidden_states=torch.randn(1, 6, 24),
                  timestep=torch.tensor([1.0]), img_shapes=[[(1, 4, 4)]], img_mask=img_mask, return_dict=False)
    assert model(**kwargs)[0].shape == (1, 22, 4)  # without the cache: forecast as usual
    with pytest.raises(ValueError, match="QwenImage21Transformer2DModel: kv_cache .* use_kv_cache=False"):
        model(**kwargs, kv_cache=QwenImage21KVCache(3), kv_cache_mode="extract")
