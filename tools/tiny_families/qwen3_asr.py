"""Tiny Qwen3-ASR, shaped as ``Qwen/Qwen3-ASR-1.7B-hf`` (the transformers layout, which vLLM's
loader reads beside the original ``thinker.*`` one): Qwen3-Omni's audio tower before a dense Qwen3
language model. Audio in, text out (``language <NAME><asr_text>`` then the transcript).

Its processor is the real ``Qwen3ASRProcessor`` with its ``Qwen3ASRFeatureExtractor`` (Whisper's
128-bin log-mel front end at 16 kHz, 30 s windows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools import tiny_models
from tools.tiny_families import common, qwen3_5, qwen3_omni_moe

# Qwen3-Omni's control tokens, then the one the transcript follows.
SPECIALS = (*qwen3_omni_moe.SPECIALS, "<asr_text>")
# Plain added tokens: the transcript's marker survives decoding that skips special tokens.
PLAIN = (*qwen3_5.PLAIN, "<asr_text>")

# The published template: an empty system turn unless one is given (its text biases the
# transcript), the audio in its markers, then the answer.
CHAT_TEMPLATE = """\
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if item.type == 'audio' or 'audio' in item or 'audio_url' in item %}
                {{- '<|audio_start|><|audio_pad|><|audio_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if messages[0].role != 'system' %}
    {{- '<|im_start|>system\\n<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# What Qwen3ASRProcessor reads off the tokenizer.
TOKEN_ATTRIBUTES = {
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "audio_token": "<|audio_pad|>",
}

SAMPLE_RATE = 16_000
WINDOW_S = 30
HOP = 160
# The encoder's attention window in mel frames (halved, as n_window counts pairs); the processor
# reads it too to count each clip's tokens.
N_WINDOW = 50


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        qwen3_5.TOKENIZER_CONFIG | {"extra_special_tokens": TOKEN_ATTRIBUTES},
    )
    common.mark_plain(out, PLAIN)
    _processor_files(out)
    common.save_random_model(
        _config(ids), out, qwen3_5.generation(ids), auto_class="AutoModelForMultimodalLM"
    )


def _processor_files(out: Path) -> None:
    common.write_json(
        out / "preprocessor_config.json",
        {
            "chunk_length": WINDOW_S,
            "dither": 0.0,
            "feature_extractor_type": "Qwen3ASRFeatureExtractor",
            "feature_size": tiny_models.MEL_BINS,
            "hop_length": HOP,
            "min_length": SAMPLE_RATE // 2,
            "n_fft": 400,
            "n_window": N_WINDOW,
            "padding_side": "right",
            "padding_value": 0.0,
            "processor_class": "Qwen3ASRProcessor",
            "return_attention_mask": True,
            "sampling_rate": SAMPLE_RATE,
        },
    )


def _config(ids: dict[str, int]) -> Any:
    from transformers import Qwen3ASRConfig

    audio = {
        "num_mel_bins": tiny_models.MEL_BINS,
        "encoder_layers": 1,
        "encoder_attention_heads": common.VISION_HEADS,
        "encoder_ffn_dim": 2 * tiny_models.AUDIO_WIDTH,
        "d_model": tiny_models.AUDIO_WIDTH,
        "output_dim": common.HIDDEN,
        "downsample_hidden_size": tiny_models.AUDIO_WIDTH // 2,
        "n_window": N_WINDOW,
        "n_window_infer": 800,
    }
    text = {
        **common.text_sizes(),
        "model_type": "qwen3",
        "head_dim": common.HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        # Tied, as published (Qwen3-1.7B's): no lm_head is saved, which vLLM's loader of the
        # transformers layout expects. Both levels say it (vLLM reads the text's).
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": common.DTYPE,
    }
    return Qwen3ASRConfig(
        audio_config=audio,
        text_config=text,
        audio_token_id=ids["<|audio_pad|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|endoftext|>"], ids["<|im_end|>"]],
        tie_word_embeddings=True,
        dtype=common.DTYPE,
    )
