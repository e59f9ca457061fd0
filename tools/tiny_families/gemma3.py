"""Tiny Gemma 3, shaped as ``google/gemma-3-4b-it``: a SigLIP tower whose patches are pooled to a
fixed number of soft tokens per image, framed by ``\\n\\n<start_of_image>`` ...
``<end_of_image>\\n\\n``, and a Gemma 3 language model (sliding and global attention layers,
tied embeddings)."""

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
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
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
# Gemma's specials and image tokens. vLLM's processor looks up runs of one to four newlines as
# single tokens (the real SentencePiece vocabulary has them); here they are plain added tokens.
NEWLINES = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
SPECIALS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
    *NEWLINES,
)
# 112 px at patch 14: an 8x8 grid pooled 2x2 to 16 soft tokens (the real 896 px pools to 256).
IMAGE_SIZE = 112
PATCH = 14
TOKENS_PER_IMAGE = 16
SIGLIP_NORM = [0.5, 0.5, 0.5]


def build(out_dir: Path) -> None:
    from transformers import Gemma3Config

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
            # Gemma3Processor reads these names from the tokenizer.
            "extra_special_tokens": {
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        },
    )
    common.mark_plain(out_dir, NEWLINES)
    common.write_json(
        out_dir / "preprocessor_config.json",
        {
            "do_convert_rgb": None,
            "do_normalize": True,
            "do_pan_and_scan": None,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": SIGLIP_NORM,
            "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": TOKENS_PER_IMAGE,
            "image_std": SIGLIP_NORM,
            "pan_and_scan_max_num_crops": None,
            "pan_and_scan_min_crop_size": None,
            "pan_and_scan_min_ratio_to_activate": None,
            "processor_class": "Gemma3Processor",
            "resample": 2,
            "rescale_factor": 1 / 255,
            "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        },
    )
    common.write_json(
        out_dir / "processor_config.json",
        {"image_seq_length": TOKENS_PER_IMAGE, "processor_class": "Gemma3Processor"},
    )
    vision = {
        "model_type": "siglip_vision_model",
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "vision_use_head": False,
    }
    text = {
        "model_type": "gemma3_text",
        "vocab_size": common.VOCAB_SIZE,
        "hidden_size": common.HIDDEN,
        "intermediate_size": common.INTERMEDIATE,
        "num_hidden_layers": common.TEXT_LAYERS,
        "num_attention_heads": common.HEADS,
        "num_key_value_heads": common.KV_HEADS,
        "head_dim": common.HEAD_DIM,
        "query_pre_attn_scalar": common.HEAD_DIM,
        "max_position_embeddings": common.MAX_POSITIONS,
        # One local (sliding) and one global layer, the real model's 5:1 pattern cut to two.
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<eos>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }
    config = Gemma3Config(
        vision_config=vision,
        text_config=text,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
        dtype=common.DTYPE,
    )
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<bos>"],
            "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
            "pad_token_id": ids["<pad>"],
        },
        rename=common.llava_hf_layout,
    )
