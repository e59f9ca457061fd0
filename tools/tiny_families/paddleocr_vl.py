"""PaddleOCR-VL (``PaddlePaddle/PaddleOCR-VL``): a NaViT-style SigLIP tower (any resolution, 2D
rotary positions) whose 2x2 patches a two-layer projector (``mlp_AR``) merges into an ERNIE-4.5
0.3B language model with M-RoPE; ``PaddleOCRVLProcessor`` with its image processor. Images only.

Images are bounded far below the published sizes (at most 256 placeholders per image)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

IMAGE_TOKEN = "<|IMAGE_PLACEHOLDER|>"
# ERNIE's control tokens the template and config name; the placeholder's neighbour keeps the
# published ``video_token_id`` (the image token's id + 1).
SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "<|begin_of_sentence|>",
    "<|end_of_sentence|>",
    IMAGE_TOKEN,
    "<|AUDIO_PLACEHOLDER|>",
    "<|IMAGE_START|>",
    "<|IMAGE_END|>",
)

# The published chat_template.jinja: images before the text of a turn, one cls token first.
CHAT_TEMPLATE = """\
{%- if not add_generation_prompt is defined -%}
    {%- set add_generation_prompt = true -%}
{%- endif -%}
{%- if not cls_token is defined -%}
    {%- set cls_token = "<|begin_of_sentence|>" -%}
{%- endif -%}
{%- if not eos_token is defined -%}
    {%- set eos_token = "</s>" -%}
{%- endif -%}
{%- if not image_token is defined -%}
    {%- set image_token = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" -%}
{%- endif -%}
{{- cls_token -}}
{%- for message in messages -%}
    {%- if message["role"] == "user" -%}
        {{- "User: " -}}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "image" -%}
                {{ image_token }}
            {%- endif -%}
        {%- endfor -%}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "text" -%}
                {{ content["text"] }}
            {%- endif -%}
        {%- endfor -%}
        {{ "\\n" -}}
    {%- elif message["role"] == "assistant" -%}
        {{- "Assistant: " -}}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "text" -%}
                {{ content["text"] }}
            {%- endif -%}
        {%- endfor -%}
        {{ eos_token -}}
    {%- elif message["role"] == "system" -%}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "text" -%}
                {{ content["text"] + "\\n" }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "Assistant: " -}}
{%- endif -%}"""

PATCH = 14
MERGE = 2
FACTOR = PATCH * MERGE
MIN_PIXELS = FACTOR * FACTOR * 16
MAX_PIXELS = FACTOR * FACTOR * 256


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<unk>",
            "unk_token": "<unk>",
            "cls_token": "<|begin_of_sentence|>",
            "sep_token": "<|end_of_sentence|>",
            # PaddleOCRVLProcessor reads the image token from the tokenizer.
            "extra_special_tokens": {"image_token": IMAGE_TOKEN},
        },
    )
    common.write_json(out / "preprocessor_config.json", _image_processor())
    generation = {
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<unk>"],
    }
    common.save_random_model(_config(ids), out, generation, rename=published_layout)


def _image_processor() -> dict[str, object]:
    return {
        "image_processor_type": "PaddleOCRVLImageProcessor",
        "processor_class": "PaddleOCRVLProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": MERGE,
        "patch_size": PATCH,
        "temporal_patch_size": 1,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    }


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import PaddleOCRVLConfig

    text = {
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "rms_norm_eps": 1e-5,
        "use_bias": False,
        # The head dim's 16 rotary pairs split over time, height and width (published: 16/24/24).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 500000.0,
            "mrope_section": [4, 6, 6],
        },
        "pad_token_id": ids["<unk>"],
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "tie_word_embeddings": False,
    }
    vision = {
        **common.vision_sizes(),
        "image_size": 384,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    return PaddleOCRVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids["<|AUDIO_PLACEHOLDER|>"],
        vision_start_token_id=ids["<|IMAGE_START|>"],
        vision_end_token_id=ids["<|IMAGE_END|>"],
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )


def published_layout(name: str) -> str:
    """transformers 5's names -> the published (Paddle) layout vLLM's loader reads: the
    language model at ``model.``, the tower at ``visual.``, the projector at ``mlp_AR.``."""
    for ours, theirs in (
        ("model.language_model.", "model."),
        ("model.visual.", "visual."),
        ("model.projector.", "mlp_AR."),
    ):
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    return name
