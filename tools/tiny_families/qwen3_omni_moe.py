"""Tiny Qwen3-Omni, shaped as ``Qwen/Qwen3-Omni-30B-A3B-Instruct``'s thinker: the whole model
transformers builds (``Qwen3OmniMoeForConditionalGeneration``), its weights under ``thinker.*``
as published. vLLM serves the thinker alone (a Qwen3-VL-style vision tower with deepstack taps,
an audio tower and a Qwen3-MoE language model with interleaved M-RoPE). The speech half (talker
and code2wav) is left out (``enable_audio_output`` off, as the published ``-Thinking`` and
``-Captioner`` checkpoints ship): vLLM skips its weights anyway.

Its processor is the real ``Qwen3OmniMoeProcessor``: the Qwen2-VL image and video processors at
Qwen3-VL's patch 16 and a ``WhisperFeatureExtractor``; images and videos are bounded as the tiny
Qwen3-VL's (``tools.tiny_models``) are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools import tiny_models
from tools.tiny_families import common, qwen2_5_omni, qwen3_5

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens in its order (151643..151675): Qwen3's, then the
# audio and speech ones.
SPECIALS = (
    *qwen3_5.SPECIALS,
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)

# The published template's chat and media parts (its tool-call parts left out): no default
# system prompt, each part in its own markers.
CHAT_TEMPLATE = """\
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- set audio_count = namespace(value=0) %}
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if item.type == 'image' or 'image' in item or 'image_url' in item %}
                {%- set image_count.value = image_count.value + 1 %}
                {%- if add_vision_id %}{{- 'Picture ' ~ image_count.value ~ ': ' }}{%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif item.type == 'audio' or 'audio' in item or 'audio_url' in item %}
                {%- set audio_count.value = audio_count.value + 1 %}
                {%- if add_audio_id %}{{- 'Audio ' ~ audio_count.value ~ ': ' }}{%- endif %}
                {{- '<|audio_start|><|audio_pad|><|audio_end|>' }}
            {%- elif item.type == 'video' or 'video' in item %}
                {%- set video_count.value = video_count.value + 1 %}
                {%- if add_vision_id %}{{- 'Video ' ~ video_count.value ~ ': ' }}{%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# What Qwen3OmniMoeProcessor reads off the tokenizer (published tokenizer_config.json).
TOKEN_ATTRIBUTES = {
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}

# The tiny Qwen3-VL, whose image and video processor files this family shares.
VISION_DONOR = "qwen3-vl"
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
EXPERT_INTERMEDIATE = common.INTERMEDIATE // 8


def build(out: Path) -> None:
    # The Qwen3-VL processor files first: the tokenizer's chat_template.jinja replaces theirs.
    tiny_models._processor_files(out, VISION_DONOR)
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        qwen3_5.TOKENIZER_CONFIG | {"extra_special_tokens": TOKEN_ATTRIBUTES},
    )
    common.mark_plain(out, qwen3_5.PLAIN)
    _omni_processor_files(out)
    common.save_random_model(
        _config(ids), out, qwen3_5.generation(ids), auto_class="AutoModelForMultimodalLM"
    )


# The Omni processor's video processor: Qwen2-VL's, which samples no frames itself (the Omni
# processor passes it no timestamps to sample by; vLLM has sampled them already).
VIDEO = {
    "video_processor_type": "Qwen2VLVideoProcessor",
    "do_sample_frames": False,
    "fps": None,
}


def _omni_processor_files(out: Path) -> None:
    """Re-label the Qwen3-VL processor files as the Omni processor's; the published
    preprocessor_config.json holds the image processor and the feature extractor side by side."""
    for name, extra in (
        ("preprocessor_config.json", qwen2_5_omni._feature_extractor()),
        ("video_preprocessor_config.json", VIDEO),
    ):
        path = out / name
        data = json.loads(path.read_text(encoding="utf-8"))
        # A None drops the Qwen3-VL key (its frame rate, which would sample frames).
        merged = {k: v for k, v in (data | extra).items() if v is not None}
        common.write_json(path, merged | {"processor_class": "Qwen3OmniMoeProcessor"})


def _thinker(ids: dict[str, int]) -> dict[str, Any]:
    text = {
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "rms_norm_eps": 1e-6,
        # The tiny Qwen3-VL's interleaved M-RoPE: sections sum to half the head dim (32 / 2).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [6, 5, 5],
            "mrope_interleaved": True,
            "interleaved": True,
        },
        "num_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": common.DTYPE,
    }
    vision = {
        **qwen3_5.vision_config(),
        # Deepstack taps must name existing vision blocks.
        "deepstack_visual_indexes": [0],
        # Published keys vLLM's tower reads: the learned grid's side in pixels (16 patches of
        # 16, as the 768 of the real 48x48 grid) and its absolute position embeddings.
        "image_size": 256,
        "apply_vit_abs_pos_embed": True,
    }
    audio = {
        "num_mel_bins": tiny_models.MEL_BINS,
        "encoder_layers": 1,
        "encoder_attention_heads": common.VISION_HEADS,
        "encoder_ffn_dim": 2 * tiny_models.AUDIO_WIDTH,
        "d_model": tiny_models.AUDIO_WIDTH,
        "output_dim": common.HIDDEN,
        "downsample_hidden_size": tiny_models.AUDIO_WIDTH // 2,
        "max_source_positions": 1500,
        "n_window": 50,
        "n_window_infer": 800,
        "conv_chunksize": 500,
    }
    return {
        "text_config": text,
        "vision_config": vision,
        "audio_config": audio,
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "audio_end_token_id": ids["<|audio_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "position_id_per_seconds": 13,
        "tie_word_embeddings": False,
        "dtype": common.DTYPE,
    }


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig(
        thinker_config=_thinker(ids),
        enable_audio_output=False,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        dtype=common.DTYPE,
    )
