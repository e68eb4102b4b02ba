"""A Reasoner turn's prompt from its conversation, reusing the request's kept context.

``build_prompt`` renders the chat template and tokenizes it the way the checkpoint's processor
does (``processor(text=..., images=..., videos=...)``: the same sub-processor arguments, the same
placeholder expansion, the same token ids), but preprocesses and encodes each media item on its
own, once per request: the features come from the :class:`ContextStore` when an earlier turn of
the request made them. ``prefill`` then runs the prompt, all but its last token, into a
transformers ``DynamicCache``, starting from the K/V the request's previous turn left where its
tokens (and media) are the same; the caller's ``generate`` feeds the last token and decodes.
The result equals a fresh ``generate`` of the whole prompt (the tests compare them token for
token in float32).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

from sglang_omni.engines.hf.context import ContextStore, MediaFeatures, TurnKV
from sglang_omni.engines.hf.conversation import Conversation, MediaItem

#: ``mm_token_type_ids`` values of the processor: text 0, image 1, video 2.
IMAGE_TYPE, VIDEO_TYPE = 1, 2


@dataclass
class Prompt:
    """The token ids ``[1, n]`` and modality types of a prompt, the token spans ``(start, end,
    sha256)`` of its media in order, and each media item's features."""

    ids: Any
    mm_types: Any
    media: list[tuple[int, int, str]]
    features: list[MediaFeatures]

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])


def build_prompt(processor: Any, model: Any, conversation: Conversation, store: ContextStore,
                 rid: str, cancelled: threading.Event | None = None) -> Prompt:
    """Tokenize ``conversation``; media features come from ``store`` or are made (and kept
    unless ``cancelled`` is set by then: an aborted request's context is released)."""
    import torch

    text = processor.apply_chat_template(conversation.messages, tokenize=False,
                                         add_generation_prompt=True)
    features = [_features(processor, model, item, store, rid, cancelled)
                for item in conversation.media]
    images = [f for f in features if f.kind == "image"]
    videos = [f for f in features if f.kind == "video"]
    image_inputs = {"image_grid_thw": _cat([f.processed["image_grid_thw"] for f in images])}
    video_inputs = {"video_grid_thw": _cat([f.processed["video_grid_thw"] for f in videos]),
                    "video_metadata": [m for f in videos for m in f.processed["video_metadata"]]}
    image_text = [processor.replace_image_token(image_inputs, image_idx=i)
                  for i in range(len(images))]
    video_text = [processor.replace_video_token(video_inputs, video_idx=i)
                  for i in range(len(videos))]
    texts, _ = processor.get_text_with_replacements([text], image_text, video_text, [])
    merged = _merged_kwargs(processor)
    text_kwargs = dict(merged["text_kwargs"])
    text_kwargs.pop("return_mm_token_type_ids", None)
    text_kwargs.pop("return_text_replacement_offsets", None)
    text_kwargs["return_tensors"] = "pt"
    ids = processor.tokenizer(texts, **text_kwargs)["input_ids"]
    mm_types = torch.tensor(processor.create_mm_token_type_ids(ids), dtype=torch.long)
    spans = _media_spans(mm_types[0].tolist(), conversation.media, features)
    return Prompt(ids, mm_types, spans, features)


def prefill(model: Any, prompt: Prompt, previous: TurnKV | None) -> tuple[Any, int]:
    """Run all but the prompt's last token into a ``DynamicCache`` (extending ``previous``'s
    where it shares the prompt's prefix) and set the model's rope deltas for decoding; returns
    the cache and how many prompt tokens were reused from ``previous``."""
    from transformers import DynamicCache

    device = model.device
    ids = prompt.ids.to(device)
    target = prompt.length - 1
    reused = 0 if previous is None else shared_prefix(prompt, previous, target)
    if previous is not None and reused > 0:
        cache = previous.cache
        for layer in cache.layers:
            extra = int(layer.keys.shape[-2]) - reused
            if extra > 0:
                layer.crop(-extra)
    else:
        cache, reused = DynamicCache(config=model.config), 0
    grids = _grids(prompt.features)
    positions, deltas = model.model.get_rope_index(ids, prompt.mm_types.to(device), **grids)
    if reused < target:
        suffix = [f for f, span in zip(prompt.features, prompt.media, strict=True)
                  if span[0] >= reused]
        model(input_ids=ids[:, reused:target], position_ids=positions[:, :, reused:target],
              past_key_values=cache, mm_encoder_outputs=_encoder_outputs(suffix),
              use_cache=True, logits_to_keep=1)
    model.model.rope_deltas = deltas
    return cache, reused


def shared_prefix(prompt: Prompt, previous: TurnKV, limit: int) -> int:
    """How many leading tokens of ``prompt`` (at most ``limit``) ``previous`` holds the K/V of:
    the same token ids, and no media item among them that differs or is cut."""
    new = prompt.ids[0, :limit].tolist()
    old = previous.ids
    count = 0
    for a, b in zip(new, old, strict=False):
        if a != b:
            break
        count += 1
    kept = set(previous.media)
    for start, end, digest in prompt.media:
        if start >= count:
            break
        if end > count or (start, end, digest) not in kept:
            return start
    return count


def _features(processor: Any, model: Any, item: MediaItem, store: ContextStore, rid: str,
              cancelled: threading.Event | None) -> MediaFeatures:
    kept = store.media(rid, item.digest)
    if kept is not None and kept.kind == item.kind:
        return kept
    made = encode_media(processor, model, item)
    store.keep_media(rid, item.digest, made, cancelled)
    return made


def encode_media(processor: Any, model: Any, item: MediaItem) -> MediaFeatures:
    """Decode, preprocess (as ``processor(...)`` would, for this item alone) and run the vision
    tower on one media item."""
    from transformers.video_utils import VideoMetadata

    value = item.decoded()
    device = model.device
    if item.kind == "image":
        merged = _merged_kwargs(processor)
        out = processor.image_processor([value], **merged["images_kwargs"])
        grid = out["image_grid_thw"]
        vision = model.model.get_image_features(out["pixel_values"].to(device), grid.to(device))
        processed: dict[str, Any] = {"image_grid_thw": grid}
    else:
        metadata = VideoMetadata(total_num_frames=len(value.frames), fps=value.fps,
                                 height=value.frames.shape[1], width=value.frames.shape[2])
        merged = _merged_kwargs(processor, video_metadata=[metadata])
        out = processor.video_processor([value.frames], **merged["videos_kwargs"])
        grid = out["video_grid_thw"]
        vision = model.model.get_video_features(out["pixel_values_videos"].to(device),
                                                grid.to(device))
        processed = {"video_grid_thw": grid, "video_metadata": list(out["video_metadata"])}
    return MediaFeatures(item.kind, processed, vision.pooler_output[0],
                         [layer[0] for layer in vision.deepstack_features])


def _merged_kwargs(processor: Any, **kwargs: Any) -> dict[str, Any]:
    """The per-modality keyword arguments ``processor.__call__`` gives its sub-processors."""
    merged: dict[str, Any] = processor._merge_kwargs(
        tokenizer_init_kwargs=processor.tokenizer.init_kwargs, return_tensors="pt", **kwargs)
    return merged


def _media_spans(types: list[int], media: list[MediaItem],
                 features: list[MediaFeatures]) -> list[tuple[int, int, str]]:
    """Each media item's token span: an image is one run of image tokens, a video one run of
    video tokens per frame group (timestamps between them)."""
    runs: dict[int, list[tuple[int, int]]] = {IMAGE_TYPE: [], VIDEO_TYPE: []}
    position = 0
    for kind, group in itertools.groupby(types):
        size = len(list(group))
        if kind in runs:
            runs[kind].append((position, position + size))
        position += size
    next_run = {IMAGE_TYPE: 0, VIDEO_TYPE: 0}
    spans = []
    for item, feature in zip(media, features, strict=True):
        kind = IMAGE_TYPE if item.kind == "image" else VIDEO_TYPE
        count = 1 if kind == IMAGE_TYPE else int(feature.processed["video_grid_thw"][0][0])
        first = next_run[kind]
        mine = runs[kind][first:first + count]
        next_run[kind] = first + count
        spans.append((mine[0][0], mine[-1][1], item.digest))
    return spans


def _grids(features: list[MediaFeatures]) -> dict[str, Any]:
    images = [f.processed["image_grid_thw"] for f in features if f.kind == "image"]
    videos = [f.processed["video_grid_thw"] for f in features if f.kind == "video"]
    return {"image_grid_thw": _cat(images), "video_grid_thw": _cat(videos)}


def _cat(tensors: list[Any]) -> Any:
    import torch

    return torch.cat(tensors) if tensors else None


def _encoder_outputs(features: list[MediaFeatures]) -> dict[str, Any] | None:
    """The vision tower outputs of ``features`` (in prompt order), as the model's
    ``mm_encoder_outputs``."""
    from transformers.models.cosmos3_omni.modeling_cosmos3_omni import (
        BaseModelOutputWithDeepstackFeatures,
    )

    out: dict[str, Any] = {}
    for kind in ("image", "video"):
        items = [f for f in features if f.kind == kind]
        if items:
            out[kind] = BaseModelOutputWithDeepstackFeatures(
                pooler_output=tuple(f.embeds for f in items),
                deepstack_features=[tuple(f.deepstack[k] for f in items)
                                    for k in range(len(items[0].deepstack))])
    return out or None
