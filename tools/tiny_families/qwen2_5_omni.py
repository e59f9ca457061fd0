"""Tiny Qwen2.5-Omni, shaped as ``Qwen/Qwen2.5-Omni-3B``: the whole model transformers builds
(``Qwen2_5OmniForConditionalGeneration``), so the weights hold ``thinker.*``, ``talker.*`` and
``token2wav.*`` as published. vLLM serves the thinker alone (a Qwen2.5-VL vision tower, a
Whisper-style audio tower and a Qwen2 language model with M-RoPE) and skips the speech half.
The published ``spk_dict.pt`` (speaker voices, a torch pickle only speech output reads) is left
out, so transformers' own ``from_pretrained`` of the whole model refuses the folder.

Its processor is the real ``Qwen2_5OmniProcessor``: the Qwen2-VL image and video processors
and a ``WhisperFeatureExtractor`` with the published 300 s window. Images and videos are bounded
as the tiny Qwen2.5-VL's (``tools.tiny_models``) are."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools import tiny_models
from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens in its order (151643..151656): Qwen2.5's, with the
# object-ref and box slots renamed to the audio tokens and the vision ones to ``bos``/``eos``.
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)

# The published chat template (chat_template.json).
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# What Qwen2_5OmniProcessor reads off the tokenizer (published tokenizer_config.json).
TOKEN_ATTRIBUTES = {
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "audio_token": "<|AUDIO|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}

PATCH = 14
MERGE = 2
TEMPORAL = 2
FACTOR = PATCH * MERGE
# Whisper's front end as published: 16 kHz, 128 mel bins, a 300 s window of 10 ms frames.
SAMPLE_RATE = 16_000
WINDOW_S = 300
HOP = 160
# The talker's codec vocabulary, shrunk from 8448; its control codes keep their places below
# the top (published 8292..8296 of 8448).
CODEC_VOCAB = 32


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "extra_special_tokens": TOKEN_ATTRIBUTES,
            "processor_class": "Qwen2_5OmniProcessor",
            "tokenizer_class": "Qwen2Tokenizer",
        },
    )
    _processor_files(out)
    _save_model(_config(ids), out, ids)


def _processor_files(out: Path) -> None:
    vision = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": common.OPENAI_CLIP_MEAN,
        "image_std": common.OPENAI_CLIP_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "processor_class": "Qwen2_5OmniProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": TEMPORAL,
    }
    # The tiny Qwen2.5-VL's bounds: a 224 px image unresized, at most 1280 tokens an image.
    image = {"shortest_edge": (2 * FACTOR) ** 2, "longest_edge": FACTOR * FACTOR * 1280}
    # The published file holds the image processor and the feature extractor side by side.
    common.write_json(
        out / "preprocessor_config.json",
        vision
        | _feature_extractor()
        | {
            "image_processor_type": "Qwen2VLImageProcessor",
            "max_pixels": image["longest_edge"],
            "min_pixels": image["shortest_edge"],
            "size": image,
        },
    )
    # The processor's own video bounds (128..768 merged tokens a frame), as the tiny Qwen2.5-VL.
    video = {"shortest_edge": FACTOR * FACTOR * 128, "longest_edge": FACTOR * FACTOR * 768}
    common.write_json(
        out / "video_preprocessor_config.json",
        vision
        | {
            "video_processor_type": "Qwen2VLVideoProcessor",
            "do_sample_frames": False,
            "max_frames": 768,
            "min_frames": 4,
            "max_pixels": video["longest_edge"],
            "min_pixels": video["shortest_edge"],
            "size": video,
            # As the tiny Qwen2.5-VL: transformers 5.22's default, and no warning per processor.
            "cap_pixels_per_frame": True,
        },
    )


def _feature_extractor() -> dict[str, Any]:
    return {
        "chunk_length": WINDOW_S,
        "dither": 0.0,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": tiny_models.MEL_BINS,
        "hop_length": HOP,
        "n_fft": 400,
        "n_samples": WINDOW_S * SAMPLE_RATE,
        "nb_max_frames": WINDOW_S * SAMPLE_RATE // HOP,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "sampling_rate": SAMPLE_RATE,
    }


def _thinker(ids: dict[str, int]) -> dict[str, Any]:
    text = {
        **common.text_sizes(),
        "rms_norm_eps": 1e-6,
        # M-RoPE sections sum to half the head dim (32 / 2), as in the tiny Qwen2.5-VL.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [4, 6, 6],
        },
        "max_window_layers": common.TEXT_LAYERS,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": common.DTYPE,
    }
    vision = {
        "depth": 1,
        "hidden_size": common.VISION_WIDTH,
        "intermediate_size": 2 * common.VISION_WIDTH,
        "num_heads": common.VISION_HEADS,
        "out_hidden_size": common.HIDDEN,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "window_size": 112,
        # The real [7, 15, 23, 31] would name missing blocks; keep one full-attention block.
        "fullatt_block_indexes": [0],
        "tokens_per_second": 25,
    }
    audio = {
        "num_mel_bins": tiny_models.MEL_BINS,
        "encoder_layers": 1,
        "encoder_attention_heads": common.VISION_HEADS,
        "encoder_ffn_dim": 2 * tiny_models.AUDIO_WIDTH,
        "d_model": tiny_models.AUDIO_WIDTH,
        "output_dim": common.HIDDEN,
        # 30 s of mel frames after the stride-2 convolution, as in the real encoder.
        "max_source_positions": 1500,
        "n_window": 100,
    }
    return {
        "text_config": text,
        "vision_config": vision,
        "audio_config": audio,
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
        "position_id_per_seconds": 25,
        "seconds_per_chunk": 2,
        # Published keys the thinker's config no longer declares; kept for readers that look.
        "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
        "dtype": common.DTYPE,
    }


def _talker(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "vocab_size": CODEC_VOCAB,
        "embedding_size": common.HIDDEN,
        "hidden_size": common.HIDDEN,
        "intermediate_size": common.INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": common.HEADS,
        "num_key_value_heads": common.KV_HEADS,
        "head_dim": common.HEAD_DIM,
        "max_position_embeddings": common.MAX_POSITIONS,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [4, 6, 6],
        },
        "tts_codec_pad_token_id": CODEC_VOCAB - 8,
        "tts_codec_start_token_id": CODEC_VOCAB - 7,
        "tts_codec_end_token_id": CODEC_VOCAB - 6,
        "tts_codec_mask_token_id": CODEC_VOCAB - 4,
        # The published text ids lie in the thinker's embedding padding past the tokenizer; the
        # tiny vocabulary has none, so three specials no chat uses stand in.
        "tts_text_pad_token_id": ids["<|box_end|>"],
        "tts_text_start_token_id": ids["<|quad_start|>"],
        "tts_text_end_token_id": ids["<|quad_end|>"],
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
        "spatial_merge_size": MERGE,
        "dtype": common.DTYPE,
    }


def _token2wav() -> dict[str, Any]:
    width = common.VISION_WIDTH
    dit = {
        "hidden_size": width,
        "num_hidden_layers": 1,
        "num_attention_heads": common.VISION_HEADS,
        "head_dim": width // common.VISION_HEADS,
        "emb_dim": width,
        "num_embeds": CODEC_VOCAB + 1,
        "look_ahead_layers": [0],
        "look_backward_layers": [0],
        "enc_emb_dim": width,
        "enc_dim": width,
        "enc_channels": [width, width, 2 * width],
        "enc_kernel_sizes": [5, 3, 1],
        "enc_dilations": [1, 2, 1],
        "enc_attention_channels": width // 2,
        "enc_se_channels": width // 2,
    }
    # Six upsampling stages halve the channels six times: 64 leaves one at the end.
    bigvgan = {
        "upsample_initial_channel": 64,
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3, 5]],
    }
    return {"dit_config": dit, "bigvgan_config": bigvgan}


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig(
        thinker_config=_thinker(ids),
        talker_config=_talker(ids),
        token2wav_config=_token2wav(),
        enable_audio_output=True,
        dtype=common.DTYPE,
    )


def _save_model(config: PreTrainedConfig, out: Path, ids: dict[str, int]) -> None:
    """Seeded random weights for the whole model (no auto class builds it), saved as
    ``common.save_random_model`` saves the others'."""
    import torch
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration
    from transformers.utils import logging as hf_logging

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(common.SEED)
        model = Qwen2_5OmniForConditionalGeneration._from_config(  # type: ignore[no-untyped-call]
            config, dtype=getattr(torch, common.DTYPE)
        )
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
