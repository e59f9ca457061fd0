"""Tiny Audio Flamingo 3, shaped as ``nvidia/audio-flamingo-3-hf``: a Whisper-style audio
encoder (its frames average-pooled by two), a two-layer projector and a Qwen2 language model.
The processor is the real ``AudioFlamingo3Processor`` (a ``WhisperFeatureExtractor`` with
128 mel bins over 30 s windows and the Qwen2 tokenizer with ``<sound>``), and the chat
template the published processor carries (one ``<sound>`` before a message's text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools import tiny_models
from tools.tiny_families import common

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<sound>")

# The published processor's chat template (chat_template.jinja).
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages if m['content'] is not none %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}"
    "{{ m['content'] }}"
    "{% else %}"
    "{% set audio = namespace(found=False) %}"
    "{% set text_buf = namespace(v='') %}"
    "{% for c in m['content'] %}"
    "{% if c.get('type') == 'audio' or 'audio' in c %}"
    "{% set audio.found = True %}"
    "{% elif c.get('type') == 'text' or 'text' in c %}"
    "{% set text_buf.v = text_buf.v + c['text'] %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if audio.found %}{{ '<sound>' }}{% endif %}{{ text_buf.v }}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

SAMPLE_RATE = 16_000
WINDOW_S = 30
HOP = 160


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
            "processor_class": "AudioFlamingo3Processor",
            "tokenizer_class": "Qwen2Tokenizer",
        },
    )
    common.write_json(
        out / "preprocessor_config.json", feature_extractor("AudioFlamingo3Processor")
    )
    common.write_json(
        out / "processor_config.json",
        {
            "audio_token": "<sound>",
            "default_transcription_prompt": "Transcribe the input speech.",
            "max_audio_len": 600,
            "processor_class": "AudioFlamingo3Processor",
        },
    )
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
        },
        auto_class="AutoModelForSeq2SeqLM",
        rename=published_layout,
    )


def feature_extractor(processor_class: str) -> dict[str, Any]:
    """Whisper's front end as the published checkpoints hold it: 16 kHz, 128 mel bins, 30 s
    windows of 10 ms frames."""
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
        "processor_class": processor_class,
        "return_attention_mask": True,
        "sampling_rate": SAMPLE_RATE,
    }


def _config(ids: dict[str, int]) -> Any:
    from transformers import AudioFlamingo3Config

    text = {
        **common.text_sizes(),
        "model_type": "qwen2",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_window_layers": common.TEXT_LAYERS,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "dtype": common.DTYPE,
    }
    audio = {
        "hidden_size": tiny_models.AUDIO_WIDTH,
        "intermediate_size": 2 * tiny_models.AUDIO_WIDTH,
        "num_hidden_layers": 1,
        "num_attention_heads": common.VISION_HEADS,
        "num_mel_bins": tiny_models.MEL_BINS,
        # 30 s of mel frames after the stride-2 convolution, as in the real encoder.
        "max_source_positions": 1500,
    }
    return AudioFlamingo3Config(
        text_config=text,
        audio_config=audio,
        audio_token_id=ids["<sound>"],
        dtype=common.DTYPE,
    )


def published_layout(name: str) -> str:
    """transformers 5's saved name -> the published one vLLM loads (``language_model.model.``,
    ``language_model.lm_head``, top-level ``audio_tower``/``multi_modal_projector``)."""
    for old, new in (
        ("model.language_model.", "language_model.model."),
        ("language_model.model.model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.audio_tower.", "audio_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ):
        if name.startswith(old):
            return new + name[len(old) :]
    return name
