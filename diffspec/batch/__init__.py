"""Batch generation to a folder: items in, keyed outputs plus per-rank manifests out, resumable and sharded.

Example:
    >>> from diffspec.batch import ItemDefaults, World, generate_batch, merge_manifests, read_items
    >>> items = read_items("examples/items.jsonl", ItemDefaults(steps=30))  # doctest: +SKIP
    >>> summary = generate_batch(pipe, items, "out/", model=model_identity(folder))  # doctest: +SKIP
    >>> merge_manifests("out/").line()  # doctest: +SKIP
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_exports
from .items import (
    FIELDS,
    GenItem,
    ItemDefaults,
    ItemError,
    item_key,
    items_from_prompts,
    model_identity,
    read_items,
)
from .shard import World, shard

_LAZY = {  # modules that import numpy or torch load on first use
    **dict.fromkeys(("PipelineAdapter", "class_id", "is_class_conditional"), ".adapter"),
    **dict.fromkeys(("ManifestWriter", "MergeSummary", "completed", "merge_manifests", "rank_manifest",
                     "read_records"), ".manifest"),
    **dict.fromkeys(("default_video_format", "read_video", "write_image", "write_video"), ".media"),
    **dict.fromkeys(("RunSummary", "all_recorded", "generate_batch", "plan"), ".runner"),
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

if TYPE_CHECKING:
    from .adapter import PipelineAdapter, class_id, is_class_conditional
    from .manifest import (
        ManifestWriter,
        MergeSummary,
        completed,
        merge_manifests,
        rank_manifest,
        read_records,
    )
    from .media import default_video_format, read_video, write_image, write_video
    from .runner import RunSummary, all_recorded, generate_batch, plan

__all__ = [
    "FIELDS",
    "GenItem",
    "ItemDefaults",
    "ItemError",
    "ManifestWriter",
    "MergeSummary",
    "PipelineAdapter",
    "RunSummary",
    "World",
    "all_recorded",
    "class_id",
    "completed",
    "default_video_format",
    "generate_batch",
    "is_class_conditional",
    "item_key",
    "items_from_prompts",
    "merge_manifests",
    "model_identity",
    "plan",
    "rank_manifest",
    "read_items",
    "read_records",
    "read_video",
    "shard",
    "write_image",
    "write_video",
]
