"""Tiny Gemma 4, shaped as ``google/gemma-4-E2B-it``: one ViT tower for images and video frames
(patches pooled 3x3 to at most 280 soft tokens per image, 70 per frame, its count following the
image's aspect ratio), a conformer audio tower (one soft token per 40 ms), each item framed as
``<|image>`` ... ``<image|>`` / ``<|audio>`` ... ``<audio|>`` (a video: ``mm:ss`` then a framed
run per frame), and the Gemma 4 language model (per-layer embeddings, sliding layers beside
global ones with a wider head and partial rotary, final logit soft-capping, tied embeddings)."""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common

# The published template's turn layout (``<|turn>role`` ... ``<turn|>``, an empty thought channel
# opening the answer unless thinking is asked for), without its tool-calling blocks.
CHAT_TEMPLATE = """{%- set loop_messages = messages -%}
{{- bos_token -}}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- if thinking or messages[0]['role'] in ['system', 'developer'] -%}
    {{- '<|turn>system\\n' -}}
    {%- if thinking -%}
        {{- '<|think|>\\n' -}}
    {%- endif -%}
    {%- if messages[0]['role'] in ['system', 'developer'] -%}
        {%- if messages[0]['content'] is string -%}
            {{- messages[0]['content'] | trim -}}
        {%- else -%}
            {{- messages[0]['content'][0]['text'] | trim -}}
        {%- endif -%}
        {%- set loop_messages = messages[1:] -%}
    {%- endif -%}
    {{- '<turn|>\\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] | trim -}}
    {%- elif message['content'] is sequence -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{- item['text'] | trim -}}
            {%- elif item['type'] == 'image' -%}
                {{- '<|image|>' -}}
            {%- elif item['type'] == 'audio' -%}
                {{- '<|audio|>' -}}
            {%- elif item['type'] == 'video' -%}
                {{- '<|video|>' -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\\n' -}}
    {%- if not enable_thinking | default(false) -%}
        {{- '<|channel>thought\\n<channel|>' -}}
    {%- endif -%}
{%- endif -%}
"""
MEDIA_TOKENS = {
    "boi_token": "<|image>",
    "image_token": "<|image|>",
    "eoi_token": "<image|>",
    "boa_token": "<|audio>",
    "audio_token": "<|audio|>",
    "eoa_token": "<audio|>",
}
SPECIALS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    *MEDIA_TOKENS.values(),
    "<|video|>",
)
# The published patching: 16 px patches pooled 3x3, at most 280 soft tokens per image and 70 per
# video frame (vLLM accepts only its published budgets, so these stay).
PATCH = 16
POOLING = 3
IMAGE_TOKENS = 280
FRAME_TOKENS = 70
SAMPLE_RATE = 16_000
# The real ratios to its 1536 width: 256 per-layer, 512-wide global heads beside 256-wide ones.
PER_LAYER_WIDTH = common.HIDDEN // 8
GLOBAL_HEAD_DIM = 2 * common.HEAD_DIM
AUDIO_WIDTH = 64
MEL_BINS = 128
# Global layers rotate a quarter of their head; sliding layers all of it.
ROPE = {
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1000000.0,
    },
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}


def build(out_dir: Path) -> None:
    from transformers import Gemma4Config

    ids = write_tokenizer(out_dir)
    _write_processor_configs(out_dir)
    config = Gemma4Config(
        text_config=_text_config(ids),
        vision_config=_vision_config(),
        audio_config=_audio_config(),
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
        dtype=common.DTYPE,
    )
    # transformers 5 writes Gemma 4 in its published layout already (model.language_model,
    # model.vision_tower, model.audio_tower, model.embed_vision, model.embed_audio).
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<bos>"],
            "eos_token_id": [ids["<eos>"], ids["<turn|>"]],
            "pad_token_id": ids["<pad>"],
        },
    )


def write_tokenizer(out_dir: Path) -> dict[str, int]:
    """The tokenizer and template Gemma 4 Unified shares; returns each special token's id."""
    return common.write_tokenizer(
        out_dir,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "add_bos_token": True,
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "mask_token": "<mask>",
            "padding_side": "left",
            # Gemma4Processor reads these names from the tokenizer.
            "extra_special_tokens": MEDIA_TOKENS,
        },
    )


def _write_processor_configs(out_dir: Path) -> None:
    common.write_json(
        out_dir / "processor_config.json",
        {
            "audio_ms_per_token": 40,
            "audio_seq_length": 750,
            "feature_extractor": {
                "dither": 0.0,
                "feature_extractor_type": "Gemma4AudioFeatureExtractor",
                "feature_size": MEL_BINS,
                "fft_overdrive": False,
                "frame_length_ms": 20.0,
                "hop_length_ms": 10.0,
                "input_scale_factor": 1.0,
                "max_frequency": 8000.0,
                "mel_floor": 0.001,
                "min_frequency": 0.0,
                "padding_side": "right",
                "padding_value": 0.0,
                "preemphasis": 0.0,
                "preemphasis_htk_flavor": True,
                "return_attention_mask": True,
                "sampling_rate": SAMPLE_RATE,
            },
            "image_processor": image_processor_config(),
            "image_seq_length": IMAGE_TOKENS,
            "processor_class": "Gemma4Processor",
            "video_processor": video_processor_config(),
        },
    )


def image_processor_config() -> dict[str, object]:
    """The image processor's keys (pixels reach the model in [0, 1], unnormalized)."""
    return {
        "do_convert_rgb": True,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_processor_type": "Gemma4ImageProcessor",
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": IMAGE_TOKENS,
        "patch_size": PATCH,
        "pooling_kernel_size": POOLING,
        "resample": 3,
        "rescale_factor": 1 / 255,
    }


def video_processor_config() -> dict[str, object]:
    """The video processor's keys: up to 32 sampled frames, each a smaller image."""
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_sample_frames": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": FRAME_TOKENS,
        "num_frames": 32,
        "patch_size": PATCH,
        "pooling_kernel_size": POOLING,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "return_metadata": True,
        "video_processor_type": "Gemma4VideoProcessor",
    }


def _text_config(ids: dict[str, int]) -> dict[str, object]:
    return {
        "model_type": "gemma4_text",
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "global_head_dim": GLOBAL_HEAD_DIM,
        "hidden_size_per_layer_input": PER_LAYER_WIDTH,
        "vocab_size_per_layer_input": common.VOCAB_SIZE,
        # One sliding and one global layer: the real 4:1 pattern cut to two layers.
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 512,
        # KV sharing needs a layer of each type before the shared ones (4 layers at least).
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0,
        "rope_parameters": ROPE,
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<eos>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }


def _vision_config() -> dict[str, object]:
    return {
        "model_type": "gemma4_vision",
        **common.vision_sizes(),
        "num_key_value_heads": common.VISION_HEADS,
        "head_dim": common.VISION_WIDTH // common.VISION_HEADS,
        "patch_size": PATCH,
        "pooling_kernel_size": POOLING,
        # vLLM reads the image budget here.
        "default_output_length": IMAGE_TOKENS,
        "dtype": common.DTYPE,
    }


def _audio_config() -> dict[str, object]:
    return {
        "model_type": "gemma4_audio",
        "hidden_size": AUDIO_WIDTH,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        # transformers sizes the projection after the two stride-2 convs as
        # ``channels[0] // 4 * channels[1]`` where the rows are ``mel bins // 4 * channels[1]``
        # wide: the first conv keeps the published width (the mel bin count) or vLLM's unchecked
        # CPU matmul writes past its output (malloc corruption) and transformers refuses the shape.
        "subsampling_conv_channels": [MEL_BINS, 8],
        "output_proj_dims": common.HIDDEN,
        "dtype": common.DTYPE,
    }
