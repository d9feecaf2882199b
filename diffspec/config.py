"""Typed, validated method configurations.

Every method has a frozen dataclass config. Validation happens in ``__post_init__`` and the
error message names the field, the bad value and the allowed range, so a user can fix a call
without reading the source.

Example:
    >>> from diffspec import ForecastConfig
    >>> cfg = ForecastConfig(interval=4, order=2)
    >>> cfg.replace(order=1).order
    1
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .checks import check_bool, check_choice, check_float, check_int, check_names, check_steps

GRANULARITIES = ("block", "module", "auto")
"""What forecast methods cache (see :class:`ForecastConfig`)."""


@dataclass(frozen=True)
class MethodConfig:
    """Base of every method config: registry metadata plus ``replace``/``to_dict``."""

    method: ClassVar[str] = ""
    family: ClassVar[str] = ""
    exact: ClassVar[bool] = False

    def replace(self, **overrides: Any) -> MethodConfig:
        """Return a copy with ``overrides`` applied (validated again).

        Raises:
            ValueError: if an override names no field of this config.
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no field(s) {', '.join(unknown)}; fields are: {', '.join(sorted(names))}"
            )
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (JSON-serialisable), including the method name."""
        return {"method": self.method, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class ForecastConfig(MethodConfig):
    """Fixed-interval Taylor forecasting of DiT block outputs (method ``taylor``).

    After ``warmup`` full steps, one full step is computed every ``interval`` steps; the steps
    in between run no transformer block at all: the output of each block list is forecast from
    the last ``order + 1`` full steps by polynomial extrapolation (differences taken in fp32).

    Args:
        order: polynomial order of the forecast (0 = reuse the last full step).
        interval: a full step every ``interval`` steps after warmup (1 = never forecast).
        warmup: leading steps that always run in full.
        last_step_full: always compute the final step in full.
        form: ``"newton"`` (exact divided differences through the anchors at their true
            spacing) or ``"taylor"`` (TaylorSeer's recursion, which divides higher levels by the
            latest gap only; bit-compatible with the reference code).
        abscissa: ``"sigma"`` (default: the ``timestep`` value the transformer receives, so
            non-uniform schedules such as shifted flow matching are extrapolated at their true
            spacing) or ``"index"`` (the step index, as the TaylorSeer/SpeCa papers).
        granularity: what is forecast. ``"block"`` (default): the residual of each block list,
            so a forecast step runs no block at all and the cache is one tensor per list and
            stream. ``"module"``: the attention and feed-forward outputs of every block
            (TaylorSeer), the blocks' gates and norms recomputed from the current conditioning;
            more memory. ``"auto"``: ``"module"`` where every block supports it and it fits
            ``max_cache_gb``, else ``"block"``.
        max_cache_gb: memory budget of the forecast cache in GB (None: no budget). Measured on
            the first step; the order, then the granularity (``"auto"``), is lowered to fit.
        blocks: names of the transformer's ``nn.ModuleList`` attributes holding its blocks, in
            execution order (None: found from ``_repeated_blocks`` or the longest block list).
        full_steps: instead of ``interval``: exactly this many full steps per generation (more than
            ``warmup``), the ``warmup`` steps, the last step and the rest spread evenly in between (placed once
            the generation's step count is known, so it suits any ``num_inference_steps``). ``None``
            (default): ``interval``.

    Example:
        >>> cfg = ForecastConfig(order=2, interval=4)
        >>> cfg.method
        'taylor'
        >>> ForecastConfig(order=2, warmup=2, full_steps=12).full_steps  # 12 full steps of any step count
        12
    """

    method: ClassVar[str] = "taylor"
    family: ClassVar[str] = "diffusion"
    exact: ClassVar[bool] = False

    order: int = 1
    interval: int = 5
    warmup: int = 3
    last_step_full: bool = True
    form: str = "newton"
    abscissa: str = "sigma"
    granularity: str = "block"
    max_cache_gb: float | None = None
    blocks: tuple[str, ...] | None = None
    full_steps: int | None = None

    def __post_init__(self) -> None:
        check_int("order", self.order, 0, 8)
        check_int("interval", self.interval, 1, 1000)
        check_int("warmup", self.warmup, 1, 10_000)
        if self.full_steps is not None:
            check_int("full_steps", self.full_steps, 1, 100_000)
            if self.full_steps <= self.warmup:
                raise ValueError(f"full_steps={self.full_steps} with warmup={self.warmup}: the warmup steps are full "
                                 f"steps and at least one more follows; allowed full_steps >= warmup + 1 = "
                                 f"{self.warmup + 1}")
        check_bool("last_step_full", self.last_step_full)
        check_choice("form", self.form, ("newton", "taylor"))
        check_choice("abscissa", self.abscissa, ("index", "sigma"))
        check_choice("granularity", self.granularity, GRANULARITIES)
        if self.max_cache_gb is not None:
            check_float("max_cache_gb", self.max_cache_gb, 0.0, lo_open=True)
        object.__setattr__(self, "blocks", check_names("blocks", self.blocks))


@dataclass(frozen=True)
class SpecaConfig(MethodConfig):
    """Taylor forecasting gated by a last-block verifier (method ``speca``, SpecA style).

    Draft steps forecast every block list as ``taylor`` does, except the last block, which runs
    on the drafted input: its true output is committed, and its distance to the drafted output,
    ``e = ||y_hat - y||_1 / ||y||_1`` per batch row, is compared with the threshold
    ``tau(p) = max(tau0 * beta**p, tau_min)`` at progress ``p`` (0 at the first step, 1 at the
    last). A rejected row is recomputed in full before it is committed (``policy="strict"``) or
    makes the next step full (``"lazy"``, as the reference code).

    Args:
        order, warmup, last_step_full, form, abscissa, granularity, max_cache_gb, blocks: as in
            :class:`ForecastConfig`.
        k_min: drafts in a row before checks start (0: every draft is checked); at most ``k_max - 2``
            with a verifier, else no draft would ever be checked.
        k_max: full steps are at most ``k_max`` steps apart (a full step is forced after
            ``k_max - 1`` drafts in a row); with ``tau0=inf`` this is ``taylor`` at ``interval=k_max``.
        tau0, beta, tau_min: the threshold schedule, finite (but ``tau0=inf``: no verifier), with
            ``tau_min <= tau0``. ``None`` (default): read from the model's calibration file
            (``diffspec calibrate``), else the generic fallback :data:`FALLBACK_TAU`.
        policy: ``"strict"`` or ``"lazy"``.
        metric: ``"rel_l1"`` (ratio of norms, bounded), ``"rel_res"`` (relative to the last
            block's own residual) or ``"rel_l1_mean"`` (the reference code's mean of elementwise
            relative errors, dominated by near-zero entries).
        replay_steps: replay mode: exactly these step indices (0-based) run in full, and no verifier
            runs (no check cost). Build it from a calibration record with
            :func:`diffspec.forecast.calibrate.replay_schedule` (the steps the gate chose most often on
            the calibration seeds). ``None`` (default): the gate decides.
        replay_full_steps: replay the schedule of this many full steps that ``diffspec calibrate
            --schedules`` searched for the model (read from its calibration file when the pipeline is
            wrapped; its granularity and order replace these fields). Exclusive with ``replay_steps``.

    Defaults (order 1, ``k_min=3``, ``k_max=8``) gave the best PSNR per unit of compute (full
    steps plus verifier blocks) on the trained ``tiny-dit`` among the settings tried (order 1-2,
    ``k_min`` 0-4, ``k_max`` 6-8). ``beta > 1`` loosens the threshold as the run progresses, which
    calibration often prefers there.

    Example:
        >>> cfg = SpecaConfig(tau0=0.05, beta=0.5, tau_min=0.01)
        >>> cfg.tau(0.0), cfg.tau(1.0)
        (0.05, 0.025)
    """

    method: ClassVar[str] = "speca"
    family: ClassVar[str] = "diffusion"
    exact: ClassVar[bool] = False

    order: int = 1
    warmup: int = 3
    k_min: int = 3
    k_max: int = 8
    tau0: float | None = None
    beta: float | None = None
    tau_min: float | None = None
    policy: str = "strict"
    metric: str = "rel_l1"
    last_step_full: bool = True
    form: str = "newton"
    abscissa: str = "sigma"
    granularity: str = "block"
    max_cache_gb: float | None = None
    blocks: tuple[str, ...] | None = None
    replay_steps: tuple[int, ...] | None = None
    replay_full_steps: int | None = None

    def __post_init__(self) -> None:
        check_int("order", self.order, 0, 8)
        check_int("warmup", self.warmup, 1, 10_000)
        object.__setattr__(self, "replay_steps", check_steps("replay_steps", self.replay_steps))
        if self.replay_full_steps is not None:
            check_int("replay_full_steps", self.replay_full_steps, 1)
            if self.replay_steps is not None:
                raise ValueError(f"replay_full_steps={self.replay_full_steps} and replay_steps={self.replay_steps} "
                                 "both set: give the steps, or the number of full steps to read from the calibration")
        check_int("k_min", self.k_min, 0, 1000)
        check_int("k_max", self.k_max, 1, 1000)
        if self.tau0 is not None:
            check_float("tau0", self.tau0, 0.0, allow_inf=True)  # inf: no draft is ever rejected
        if self.beta is not None:
            check_float("beta", self.beta, 0.0, 100.0, lo_open=True)
        if self.tau_min is not None:
            check_float("tau_min", self.tau_min, 0.0)
        self._check_relations()
        check_bool("last_step_full", self.last_step_full)
        check_choice("policy", self.policy, ("strict", "lazy"))
        check_choice("metric", self.metric, ("rel_l1", "rel_res", "rel_l1_mean"))
        check_choice("form", self.form, ("newton", "taylor"))
        check_choice("abscissa", self.abscissa, ("index", "sigma"))
        check_choice("granularity", self.granularity, GRANULARITIES)
        if self.max_cache_gb is not None:
            check_float("max_cache_gb", self.max_cache_gb, 0.0, lo_open=True)
        object.__setattr__(self, "blocks", check_names("blocks", self.blocks))

    def _check_relations(self) -> None:
        """``tau_min <= tau0``; with a verifier (``tau0`` not ``inf``, no replay), ``k_min <= k_max - 2``."""
        if self.tau0 is not None and self.tau_min is not None and self.tau_min > self.tau0:
            raise ValueError(f"tau_min={self.tau_min} is above tau0={self.tau0}: tau0 is the threshold at the first "
                             "step and tau_min its floor; allowed tau_min <= tau0")
        replay = self.replay_steps is not None or self.replay_full_steps is not None
        if not replay and (self.tau0 is None or math.isfinite(self.tau0)) and self.k_min > self.k_max - 2:
            raise ValueError(f"k_min={self.k_min} with k_max={self.k_max}: no draft would ever be checked (drafts run "
                             f"at most k_max - 1 = {self.k_max - 1} in a row and checks start after k_min of them); "
                             f"allowed k_min <= k_max - 2 = {self.k_max - 2}. Lower k_min or raise k_max, or set "
                             "tau0=inf for unverified forecasting")

    @property
    def calibrated(self) -> bool:
        """True when the three threshold values are set."""
        return None not in (self.tau0, self.beta, self.tau_min)

    def with_fallback(self) -> SpecaConfig:
        """Fill unset threshold values from :data:`FALLBACK_TAU` (see :meth:`fill_thresholds`)."""
        return self.fill_thresholds(FALLBACK_TAU)

    def fill_thresholds(self, values: Mapping[str, Any]) -> SpecaConfig:
        """Set the unset ``tau0`` / ``beta`` / ``tau_min`` from ``values`` (a calibration record, the fallback),
        keeping ``tau_min <= tau0``: a filled ``tau_min`` is lowered to a ``tau0`` set here, a filled ``tau0``
        raised to a ``tau_min`` set here.

        Example:
            >>> SpecaConfig(tau0=0.01).fill_thresholds({"tau0": 0.1, "beta": 0.3, "tau_min": 0.02}).tau_min
            0.01
        """
        fill = {k: float(values[k]) for k in ("tau0", "beta", "tau_min") if getattr(self, k) is None}
        if "tau_min" in fill and self.tau0 is not None:
            fill["tau_min"] = min(fill["tau_min"], self.tau0)
        if "tau0" in fill and self.tau_min is not None:
            fill["tau0"] = max(fill["tau0"], self.tau_min)
        return self.replace(**fill)  # type: ignore[return-value]

    def tau(self, progress: float) -> float:
        """The threshold at ``progress`` in [0, 1]."""
        cfg = self if self.calibrated else self.with_fallback()
        if math.isinf(cfg.tau0):  # type: ignore[arg-type]
            return math.inf
        return max(cfg.tau0 * cfg.beta**progress, cfg.tau_min)  # type: ignore[operator]


FALLBACK_TAU: dict[str, float] = {"tau0": 0.1, "beta": 0.3, "tau_min": 0.02}
"""Thresholds used by ``speca`` when neither the call nor a calibration file sets them."""


def check_lookahead(lookahead: Any, max_lookahead: Any, adaptive: Any) -> None:
    """The lookahead fields of the exact samplers' configs (``ValueError`` naming the field)."""
    check_int("lookahead", lookahead, 1, 256)
    check_int("max_lookahead", max_lookahead, 1, 256)
    if max_lookahead < lookahead:
        raise ValueError(f"max_lookahead={max_lookahead} is out of range: allowed [lookahead={lookahead}, 256]")
    check_bool("adaptive", adaptive)


@dataclass(frozen=True)
class CouplingConfig(MethodConfig):
    """Exact speculative sampling with reflection maximal coupling (method ``coupling``).

    Each round drafts up to ``lookahead`` future steps of a stochastic sampler without the
    network (the draft freezes the last predicted clean sample ``x0`` and re-applies the
    scheduler's mean), evaluates the target on all drafted states in one batched call, keeps the
    longest prefix the reflection coupling accepts and reflects the first rejected step. The
    output has exactly the plain sampler's law (same model, scheduler, steps, guidance).

    Args:
        lookahead: drafted steps per round at the start (1 = the plain sampler, one call a step).
        adaptive: double the lookahead after a round where every trajectory accepted all its
            drafts, halve it after a round that committed less than half on average.
        max_lookahead: the adaptive lookahead's upper bound.
        draft: what is frozen between target calls: ``"x0"`` (the predicted clean sample,
            recommended), ``"output"`` (the network's guided output, e.g. its noise prediction)
            or ``"increment"`` (the last target mean minus its state). Experimental, SpeCa-style:
            ``"forecast"`` extrapolates the ``x0`` predictions of the previous target calls on the
            committed path (Newton polynomial of degree ``forecast_order`` in the step index),
            ``"forecast-output"`` the raw network outputs; both re-apply the scheduler's mean and
            stay exact (the coupling verifies), only acceptance changes.
        forecast_order: the forecast drafts' polynomial degree (1-3); ignored otherwise.
        eta: DDIM's noise level (in ``(0, 1]``; 1 equals DDPM) for a pipeline whose call takes ``eta``
            (PixArt) when the call passes none; ``None`` (default): the call's ``eta``. A call's ``eta``
            that differs is an error; other schedulers ignore it, as the pipeline's ``step`` does.

    Example:
        >>> CouplingConfig(lookahead=8).exact
        True
    """

    method: ClassVar[str] = "coupling"
    family: ClassVar[str] = "diffusion"
    exact: ClassVar[bool] = True

    lookahead: int = 4
    adaptive: bool = True
    max_lookahead: int = 16
    draft: str = "x0"
    eta: float | None = None
    forecast_order: int = 1

    def __post_init__(self) -> None:
        check_lookahead(self.lookahead, self.max_lookahead, self.adaptive)
        check_choice("draft", self.draft, DRAFTS)
        check_int("forecast_order", self.forecast_order, 1, 3)
        if self.eta is not None:
            check_float("eta", self.eta, 0.0, 1.0, lo_open=True)


DRAFTS = ("x0", "output", "increment", "forecast", "forecast-output")
"""What exact speculative samplers freeze between target calls (see :class:`CouplingConfig`)."""


@dataclass(frozen=True)
class AutospecConfig(MethodConfig):
    """Autospeculative decoding (ASD, Hu et al. 2025) for DDPM samplers (method ``autospec``).

    Given the present state, a DDPM step's increments are exchangeable, so each round draws the
    next ``lookahead`` increments from the law of the next one (the clean-sample prediction at the
    current state, frozen), evaluates the network on every drafted state in one batched call and
    keeps the prefix the reflection coupling accepts. The first drafted step is exact and always
    kept; a round that rejects costs one more call to evaluate its corrected state. Exact.

    Args:
        lookahead, adaptive, max_lookahead: as in :class:`CouplingConfig`.

    Example:
        >>> AutospecConfig(lookahead=6).method
        'autospec'
    """

    method: ClassVar[str] = "autospec"
    family: ClassVar[str] = "diffusion"
    exact: ClassVar[bool] = True

    lookahead: int = 4
    adaptive: bool = True
    max_lookahead: int = 16

    def __post_init__(self) -> None:
        check_lookahead(self.lookahead, self.max_lookahead, self.adaptive)


QUALITY_PRESETS: dict[str, float | None] = {"exact": None, "high": 40.0, "balanced": 32.0, "fast": 26.0}
"""``method="auto"``'s quality presets: the PSNR floor (dB) against the full-compute output of the same seed
(``"exact"``: exact methods only). Chosen from the ``tiny-dit`` forecast benchmarks (``docs/auto.md``)."""


AUTO_SAMPLES = {"diffusion": 16, "multimodal": 16, "ar_image": 64}
"""``AutoConfig.samples`` by target family when it is not given: an AR image is cheap to generate and its calls vary
from image to image (on ``tiny-ar-tex`` the ratio of ``mc-sjd``'s calls at windows 8 and 16 ranged 1.19-1.38 over
sets of 16 images, 1.27-1.31 over sets of 64), so its windows are compared on more images."""


@dataclass(frozen=True)
class AutoConfig(MethodConfig):
    """``method="auto"``: the fastest method that meets a quality target, tuned on the call's own prompts.

    Args:
        quality: a preset of :data:`QUALITY_PRESETS` (``"exact"``: exact methods only; ``"high"``, ``"balanced"``,
            ``"fast"``: a PSNR floor) or a PSNR floor in dB, in ``(0, 100]``.
        samples: generations the candidates are measured on (the call's first prompts or labels in turn, seeds 5000
            on); distinct prompts make the quality bound tighter than repeated ones. Default: by target family
            (:data:`AUTO_SAMPLES`: 16, 64 for AR image).

    Example:
        >>> AutoConfig(quality="balanced").floor
        32.0
        >>> AutoConfig(quality=35).floor
        35.0
    """

    method: ClassVar[str] = "auto"
    family: ClassVar[str] = "diffusion"
    exact: ClassVar[bool] = False

    quality: str | float = "balanced"
    samples: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.quality, str):
            if self.quality not in QUALITY_PRESETS:
                raise ValueError(f"quality={self.quality!r} is not supported: choose one of "
                                 f"{', '.join(map(repr, QUALITY_PRESETS))} or a PSNR floor in dB in (0, 100]")
        else:
            check_float("quality", self.quality, 0.0, 100.0, lo_open=True)
        if self.samples is not None:
            check_int("samples", self.samples, 1, 64)

    def sample_count(self, family: str) -> int:
        """``samples``, or the default of a target ``family`` (:data:`AUTO_SAMPLES`).

        Example:
            >>> AutoConfig().sample_count("ar_image"), AutoConfig(samples=4).sample_count("ar_image")
            (64, 4)
        """
        return AUTO_SAMPLES[family] if self.samples is None else self.samples

    @property
    def floor(self) -> float | None:
        """The PSNR floor in dB (None: ``"exact"``)."""
        return QUALITY_PRESETS[self.quality] if isinstance(self.quality, str) else float(self.quality)
