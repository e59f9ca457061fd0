"""MiniCPM-V 4.6 (``openbmb/MiniCPM-V-4.6``): a SigLIP tower with a window-attention merger
inside it and a merger after it (16 patches to one token), before a Qwen3.5 hybrid language
model (``tools.tiny_families.qwen3_5``'s: one Gated-DeltaNet layer, one full-attention layer);
``MiniCPMV4_6Processor`` slices an image into a base view plus up to 9 slices, each wrapped in
``<image>``/``<slice>`` markers behind an ``<image_id>`` number.

The tiny tower sees 112 px per view (448 published), so a view costs 4 placeholders. The chat
template is Qwen3.5's (an image is ``<|vision_start|><|image_pad|><|vision_end|>``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.tiny_families import common, qwen3_5

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

MARKERS = ("<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>")
SPECIALS = (*qwen3_5.SPECIALS, *MARKERS)
# The processor reads every marker off the tokenizer by these names.
NAMED_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}
PATCH = 14
VIEW = 112


def build(out: Path) -> None:
    ids = write_tokenizer(out)
    processor_files(out, "MiniCPMV4_6Processor")
    common.save_random_model(config(ids, "MiniCPMV4_6Config"), out, qwen3_5.generation(ids))


def write_tokenizer(out: Path) -> dict[str, int]:
    tokenizer = qwen3_5.TOKENIZER_CONFIG | {"extra_special_tokens": NAMED_TOKENS}
    ids = common.write_tokenizer(out, SPECIALS, qwen3_5.CHAT_TEMPLATE, tokenizer)
    common.mark_plain(out, qwen3_5.PLAIN)
    return ids


def processor_files(out: Path, processor: str) -> None:
    """The image and video processors' configs (MiniCPM-V 4.7 publishes the same)."""
    keys: dict[str, Any] = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "max_slice_nums": 9,
        "scale_resolution": VIEW,
        "patch_size": PATCH,
        "slice_mode": True,
        "downsample_mode": "16x",
        "use_image_id": True,
        "processor_class": processor,
        "resample": 3,
        "rescale_factor": 1 / 255,
    }
    common.write_json(
        out / "preprocessor_config.json",
        keys | {"image_processor_type": "MiniCPMV4_6ImageProcessor"},
    )
    common.write_json(
        out / "video_preprocessor_config.json",
        keys
        | {
            "video_processor_type": "MiniCPMV4_6VideoProcessor",
            "do_sample_frames": True,
            "max_num_frames": 16,
            "stack_frames": 1,
        },
    )


def config(ids: dict[str, int], cls: str, **extra: Any) -> PreTrainedConfig:
    """The ``cls`` config (4.6's, or 4.7's with ``extra`` keys) over the tiny tower and LM."""
    import transformers

    vision = {
        **common.vision_sizes(),
        "image_size": VIEW,
        "patch_size": PATCH,
        "insert_layer_id": 0,
    }
    text = {"model_type": "qwen3_5_text", **qwen3_5.text_config(ids)}
    built: PreTrainedConfig = getattr(transformers, cls)(
        text_config=text,
        vision_config=vision,
        insert_layer_id=0,
        image_size=VIEW,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=False,
        dtype=common.DTYPE,
        **extra,
    )
    return built
