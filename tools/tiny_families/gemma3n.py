"""Tiny Gemma 3n, shaped as ``google/gemma-3n-E2B-it``: a MobileNetV5 tower (timm's
``mobilenetv5_300m_enc`` behind transformers' ``TimmWrapperModel``) whose fused features are
pooled to a fixed grid of soft tokens per image, a USM conformer audio tower whose frames fill a
fixed number of soft tokens per clip, both framed by ``\\n\\n<start_of_X>`` ...
``<end_of_X>\\n\\n``, and the Gemma 3n language model (AltUp, LAuReL, per-layer embeddings,
activation sparsity, sliding and global attention, tied embeddings).

The vocabulary keeps the published layout: text ids first (the per-layer embedding table's
range), then the vision range starting with ``<end_of_image>``, ``<image_soft_token>``, then the
audio range starting with ``<end_of_audio>``, ``<audio_soft_token>``; the model embeds ids of
each range with that modality's own table."""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common

# The published template (its text after JSON decoding, so the quoted newlines are real ones).
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'audio' -%}
                {{ '<audio_soft_token>' }}
            {%- elif item['type'] == 'image' -%}
                {{ '<image_soft_token>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"""
# vLLM's processor looks up runs of one to four newlines as single tokens (the real
# SentencePiece vocabulary has them); here they are plain added tokens.
NEWLINES = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
# The last ids, in this order: the vision range, then the audio range (each starts with its end
# token and its soft token, as published).
VISION_TOKENS = ("<end_of_image>", "<image_soft_token>")
AUDIO_TOKENS = ("<end_of_audio>", "<audio_soft_token>")
SPECIALS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<start_of_audio>",
    *NEWLINES,
    *VISION_TOKENS,
    *AUDIO_TOKENS,
)
TEXT_VOCAB = common.VOCAB_SIZE - len(VISION_TOKENS) - len(AUDIO_TOKENS)

# 128 px through the tower's /16 stage (8x8), pooled to a 4x4 grid: 16 soft tokens per image
# (the real 768 px gives 48x48 pooled to 16x16, 256 tokens).
IMAGE_SIZE = 128
IMAGE_GRID = 4
TOKENS_PER_IMAGE = IMAGE_GRID**2
# The published block layout with every channel count cut 64-fold (timm rounds them to
# multiples of 8) and a narrow stem. Its fused output width is fixed at 2048 by timm.
TOWER_ARGS = {"channel_multiplier": 1 / 64, "stem_size": 16, "msfa_output_resolution": IMAGE_GRID}
TOWER_WIDTH = 2048
# Soft tokens per clip: a clip's frames fill them and the rest are padding (the real 188 hold
# 30 s; 16 hold about 2.5 s here, as each token is 160 ms of audio).
TOKENS_PER_AUDIO = 16
AUDIO_WIDTH = 64
MEL_BINS = 128
SAMPLE_RATE = 16_000


def build(out_dir: Path) -> None:
    from transformers import Gemma3nConfig

    ids = _write_tokenizer(out_dir)
    _write_processor_configs(out_dir)
    config = Gemma3nConfig(
        text_config=_text_config(ids),
        vision_config=_vision_config(),
        audio_config=_audio_config(),
        audio_soft_tokens_per_image=TOKENS_PER_AUDIO,
        vision_soft_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_id=ids["<start_of_image>"],
        eoi_token_id=ids["<end_of_image>"],
        image_token_id=ids["<image_soft_token>"],
        boa_token_id=ids["<start_of_audio>"],
        eoa_token_id=ids["<end_of_audio>"],
        audio_token_id=ids["<audio_soft_token>"],
        dtype=common.DTYPE,
    )
    # transformers 5 writes Gemma 3n in its published layout already (model.language_model,
    # model.vision_tower.timm_model, model.audio_tower, model.embed_vision, model.embed_audio).
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<bos>"],
            "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
            "pad_token_id": ids["<pad>"],
        },
    )


def _write_tokenizer(out_dir: Path) -> dict[str, int]:
    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "add_bos_token": True,
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "padding_side": "left",
            # Gemma3nProcessor reads these names from the tokenizer.
            "extra_special_tokens": {
                "audio_token": "<audio_soft_token>",
                "boa_token": "<start_of_audio>",
                "boi_token": "<start_of_image>",
                "eoa_token": "<end_of_audio>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        },
    )
    common.mark_plain(out_dir, NEWLINES)
    return ids


def _write_processor_configs(out_dir: Path) -> None:
    """The published joint ``preprocessor_config.json`` (the audio feature extractor's keys and
    the SigLIP image processor's in one file) and the processor's own config."""
    audio = {
        "dither": 0.0,
        "feature_extractor_type": "Gemma3nAudioFeatureExtractor",
        "feature_size": MEL_BINS,
        "fft_length": 1024,
        "fft_overdrive": True,
        "frame_length": 512,
        "hop_length": 160,
        "input_scale_factor": 1.0,
        "max_frequency": 7600.0,
        "mel_floor": 1e-05,
        "min_frequency": 125.0,
        "padding_side": "right",
        "padding_value": 0.0,
        "per_bin_mean": None,
        "per_bin_stddev": None,
        "preemphasis": 0.97,
        "preemphasis_htk_flavor": True,
        "return_attention_mask": True,
        "sampling_rate": SAMPLE_RATE,
    }
    image = {
        "do_convert_rgb": None,
        # Pixels reach the tower in [0, 1]: the published config rescales but does not normalize.
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "SiglipImageProcessorFast",
        "image_seq_length": TOKENS_PER_IMAGE,
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    }
    common.write_json(
        out_dir / "preprocessor_config.json",
        audio | image | {"processor_class": "Gemma3nProcessor"},
    )
    common.write_json(
        out_dir / "processor_config.json",
        {
            "audio_seq_length": TOKENS_PER_AUDIO,
            "image_seq_length": TOKENS_PER_IMAGE,
            "processor_class": "Gemma3nProcessor",
        },
    )


def _text_config(ids: dict[str, int]) -> dict[str, object]:
    return {
        "model_type": "gemma3n_text",
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        # The ids below the vision range get per-layer embeddings; the rest use token 0's.
        "vocab_size_per_layer_input": TEXT_VOCAB,
        # The real model's ratios to its 2048 width: 256 per-layer, 64 LAuReL rank.
        "hidden_size_per_layer_input": common.HIDDEN // 8,
        "laurel_rank": common.HIDDEN // 32,
        "altup_num_inputs": 4,
        # One sparse and one dense layer, sliding then global: the real pattern cut to two layers.
        "activation_sparsity_pattern": [0.95, 0.0],
        "layer_types": ["sliding_attention", "full_attention"],
        # KV sharing needs a layer of each type before the shared ones (4 layers at least).
        "num_kv_shared_layers": 0,
        "sliding_window": 512,
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<eos>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }


def _vision_config() -> dict[str, object]:
    return {
        "model_type": "gemma3n_vision",
        "architecture": "mobilenetv5_300m_enc",
        "model_args": TOWER_ARGS,
        "hidden_size": TOWER_WIDTH,
        "vocab_size": len(VISION_TOKENS),
        "vocab_offset": TEXT_VOCAB,
        # No ImageNet labels: the tower is an encoder.
        "num_classes": 0,
        "label_names": [],
        "dtype": common.DTYPE,
    }


def _audio_config() -> dict[str, object]:
    return {
        "model_type": "gemma3n_audio",
        "input_feat_size": MEL_BINS,
        "hidden_size": AUDIO_WIDTH,
        "conf_num_attention_heads": 2,
        "conf_num_hidden_layers": 1,
        "sscp_conv_channel_size": [16, 8],
        "vocab_size": len(AUDIO_TOKENS),
        "vocab_offset": TEXT_VOCAB + len(VISION_TOKENS),
        "dtype": common.DTYPE,
    }
