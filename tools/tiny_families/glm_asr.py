"""Tiny GLM-ASR, shaped as ``zai-org/GLM-ASR-Nano-2512`` (transformers' conversion): a
Whisper-style audio encoder with rotary attention, four frames merged per token by a two-layer
projector, and a Llama language model with tied embeddings. The processor is the real
``GlmAsrProcessor`` (a ``WhisperFeatureExtractor`` with 128 mel bins over 30 s windows; audio
runs as ``<|pad|>`` tokens between ``<|begin_of_audio|>`` and ``<|end_of_audio|>``), with the
chat template transformers' conversion publishes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools import tiny_models
from tools.tiny_families import common
from tools.tiny_families.audio_flamingo3 import feature_extractor, published_layout

# The GLM-4 control tokens in their published order (59246..), the audio ones after them.
SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|pad|>",
)

# The published chat template (transformers' convert_glmasr_weights_to_hf.py).
CHAT_TEMPLATE = (
    "{%- macro to_text(content) -%}\n"
    "{%- if content is string -%}\n"
    "{{- content -}}\n"
    "{%- elif content is iterable and content is not mapping -%}\n"
    "{%- for item in content -%}\n"
    "{%- if item is mapping and item.type == 'text' and item.text is defined -%}\n"
    "{{- item.text -}}\n"
    "{%- elif item is mapping and (item.type == 'audio' or 'audio' in item) -%}\n"
    "<|begin_of_audio|><|pad|><|end_of_audio|><|user|>\n"
    "{% elif item is string -%}\n"
    "{{- item -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- else -%}\n"
    "{{- content -}}\n"
    "{%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- for m in messages -%}\n"
    "{%- if m.role == 'system' -%}\n"
    "<|system|>\n"
    "{{ to_text(m.content) | trim }}\n"
    "{%- elif m.role == 'user' -%}\n"
    "<|user|>\n"
    "{{ to_text(m.content) | trim }}\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "<|assistant|>\n"
    "{{ to_text(m.content) | trim }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "<|assistant|>\n"
    "{% endif -%}"
)

# Frames the projector merges into one token.
MERGE = 4


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            # The conversion sets the pad token to the eos token.
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "processor_class": "GlmAsrProcessor",
        },
    )
    common.write_json(out / "preprocessor_config.json", feature_extractor("GlmAsrProcessor"))
    common.write_json(
        out / "processor_config.json",
        {
            "audio_token": "<|pad|>",
            "default_transcription_prompt": "Please transcribe this audio into text",
            "max_audio_len": 655,
            "processor_class": "GlmAsrProcessor",
        },
    )
    eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]
    common.save_random_model(
        _config(ids, eos),
        out,
        {"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"]},
        auto_class="AutoModelForSeq2SeqLM",
        rename=published_layout,
    )


def _config(ids: dict[str, int], eos: list[int]) -> Any:
    from transformers import GlmAsrConfig

    text = {
        **common.text_sizes(),
        "model_type": "llama",
        "head_dim": common.HEAD_DIM,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "eos_token_id": eos,
        "tie_word_embeddings": True,
        "dtype": common.DTYPE,
    }
    audio = {
        "hidden_size": tiny_models.AUDIO_WIDTH,
        # The projector reads MERGE stacked frames: its input is this width.
        "intermediate_size": MERGE * tiny_models.AUDIO_WIDTH,
        "num_hidden_layers": 1,
        "num_attention_heads": common.VISION_HEADS,
        "num_mel_bins": tiny_models.MEL_BINS,
        "max_position_embeddings": 1500,
        # Rotary over half of each head, as published.
        "rope_parameters": {
            "rope_theta": 10000.0,
            "rope_type": "default",
            "partial_rotary_factor": 0.5,
        },
    }
    return GlmAsrConfig(
        text_config=text,
        audio_config=audio,
        audio_token_id=ids["<|pad|>"],
        tie_word_embeddings=True,
        dtype=common.DTYPE,
    )
