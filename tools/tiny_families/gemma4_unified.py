"""Tiny Gemma 4 Unified, shaped as ``google/gemma-4-12B-it``: encoder-free, its images and video
frames cut into 48 px patches (16 px patches merged 3x3) that one dense layer with factorized 2D
position embeddings projects into the language model (at most 280 soft tokens per image, 70 per
frame), its audio raw 40 ms waveform frames projected the same way, framed and templated as
Gemma 4 (``tools.tiny_families.gemma4``); the language model is Gemma 4's without per-layer
embeddings, image tokens attending to each other both ways."""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common, gemma4

# 16 kHz audio at one token per 40 ms: each token is a frame of 640 samples (fixed by the format).
AUDIO_SAMPLES_PER_TOKEN = 640


def build(out_dir: Path) -> None:
    from transformers import Gemma4UnifiedConfig

    ids = gemma4.write_tokenizer(out_dir)
    _write_processor_configs(out_dir)
    config = Gemma4UnifiedConfig(
        text_config=_text_config(ids),
        vision_config=_vision_config(),
        audio_config={
            "model_type": "gemma4_unified_audio",
            "audio_embed_dim": AUDIO_SAMPLES_PER_TOKEN,
        },
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
        dtype=common.DTYPE,
    )
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<bos>"],
            "eos_token_id": [ids["<eos>"], ids["<turn|>"]],
            "pad_token_id": ids["<pad>"],
        },
    )


def _write_processor_configs(out_dir: Path) -> None:
    image = gemma4.image_processor_config() | {
        "image_processor_type": "Gemma4UnifiedImageProcessor"
    }
    video = gemma4.video_processor_config() | {
        "video_processor_type": "Gemma4UnifiedVideoProcessor"
    }
    common.write_json(
        out_dir / "processor_config.json",
        {
            "audio_ms_per_token": 40,
            "audio_seq_length": 750,
            "feature_extractor": {
                "audio_samples_per_token": AUDIO_SAMPLES_PER_TOKEN,
                "feature_extractor_type": "Gemma4UnifiedAudioFeatureExtractor",
                "feature_size": AUDIO_SAMPLES_PER_TOKEN,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": True,
                "sampling_rate": gemma4.SAMPLE_RATE,
            },
            "image_processor": image,
            "image_seq_length": gemma4.IMAGE_TOKENS,
            "processor_class": "Gemma4UnifiedProcessor",
            "video_processor": video,
        },
    )


def _text_config(ids: dict[str, int]) -> dict[str, object]:
    return {
        "model_type": "gemma4_unified_text",
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "global_head_dim": gemma4.GLOBAL_HEAD_DIM,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 1024,
        "use_bidirectional_attention": "vision",
        "final_logit_softcapping": 30.0,
        "rope_parameters": gemma4.ROPE,
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<eos>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }


def _vision_config() -> dict[str, object]:
    return {
        "model_type": "gemma4_unified_vision",
        "patch_size": gemma4.PATCH,
        "pooling_kernel_size": gemma4.POOLING,
        # The patch projection writes the language model's width, as published.
        "mm_embed_dim": common.HIDDEN,
        "output_proj_dims": common.HIDDEN,
        "mm_posemb_size": 1120,
        # vLLM reads the image budget here.
        "num_soft_tokens": gemma4.IMAGE_TOKENS,
        "dtype": common.DTYPE,
    }
