"""Mistral 3 (``mistralai/Mistral-Small-3.1-24B-Instruct-2503``, transformers format): a Mistral
text model, the Pixtral vision tower and ``PixtralProcessor``, with an HF ``tokenizer.json`` (no
``tekken.json``, so vLLM reads it with the HF tokenizer, not mistral-common).

Images are capped at 448 pixels on the longest edge (1540 in the published model): a 448x448
image is 16 rows of 16 ``[IMG]`` placeholders, each row closed by ``[IMG_BREAK]`` and the last by
``[IMG_END]``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens, in its order (it has them first; here they are last).
SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)

# The published chat template (Mistral-Small-3.1-24B-Instruct-2503's processor): its default
# system prompt carries today's date (``strftime_now``), so the prompt changes at midnight. (One
# trailing space after an ``{%- else %}`` is dropped: the next tag's ``{%-`` strips it anyway.)
CHAT_TEMPLATE = """\
{%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are Mistral Small 3, a Large Language Model (LLM) created by \
Mistral AI, a French startup headquartered in Paris.\\nYour knowledge base was last updated on \
2023-10-01. The current date is " + today + ".\\n\\nWhen you're not sure about some information, \
you say that you don't have the information and don't make up anything.\\nIf the user's question \
is not clear, ambiguous, or does not provide enough context for you to accurately answer the \
question, you do not try to answer it right away and you rather ask the user to clarify their \
request (e.g. \\"What are some good restaurants around me?\\" => \\"Where are you?\\" or \\"When \
is the next flight to Tokyo\\" => \\"Where do you travel from?\\")" %}

{{- bos_token }}

{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0] is string %}
        {%- set system_message = messages[0]['content'] %}
        {%- set loop_messages = messages[1:] %}
    {%- else %}
        {%- set system_message = messages[0]['content'][0]['text'] %}
        {%- set loop_messages = messages[1:] %}
    {%- endif %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}

{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
            {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
            {%- else %}
                    {{- '[INST]' }}
                    {%- for block in message['content'] %}
                            {%- if block['type'] == 'text' %}
                                    {{- block['text'] }}
                            {%- elif block['type'] == 'image' or block['type'] == 'image_url' %}
                                    {{- '[IMG]' }}
                                {%- else %}
                                    {{- raise_exception('Only text and image blocks are supported \
in message content!') }}
                                {%- endif %}
                        {%- endfor %}
                    {{- '[/INST]' }}
                {%- endif %}
    {%- elif message['role'] == 'system' %}
        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {{- message['content'][0]['text'] + eos_token }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Only user, system and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""

LONGEST_EDGE = 448
PATCH = 14
MERGE = 2


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        },
    )
    _processor_files(out)
    common.save_random_model(
        _config(ids),
        out,
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]},
    )


def _processor_files(out: Path) -> None:
    common.write_json(
        out / "preprocessor_config.json",
        {
            "crop_size": None,
            "data_format": "channels_first",
            "default_to_square": True,
            "do_center_crop": None,
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": common.OPENAI_CLIP_MEAN,
            "image_processor_type": "PixtralImageProcessorFast",
            "image_std": common.OPENAI_CLIP_STD,
            "patch_size": PATCH,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"longest_edge": LONGEST_EDGE},
        },
    )
    common.write_json(
        out / "processor_config.json",
        {
            "image_break_token": "[IMG_BREAK]",
            "image_end_token": "[IMG_END]",
            "image_token": "[IMG]",
            "patch_size": PATCH,
            "processor_class": "PixtralProcessor",
            "spatial_merge_size": MERGE,
        },
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Mistral3Config

    text = {
        "model_type": "mistral",
        "vocab_size": common.VOCAB_SIZE,
        "hidden_size": common.HIDDEN,
        "intermediate_size": common.INTERMEDIATE,
        "num_hidden_layers": common.TEXT_LAYERS,
        "num_attention_heads": common.HEADS,
        "num_key_value_heads": common.KV_HEADS,
        "head_dim": common.HEAD_DIM,
        "max_position_embeddings": common.MAX_POSITIONS,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000000.0},
        "sliding_window": None,
        "rms_norm_eps": 1e-5,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
        "tie_word_embeddings": False,
        "dtype": common.DTYPE,
    }
    vision = {
        "model_type": "pixtral",
        **common.vision_sizes(),
        "head_dim": common.VISION_WIDTH // common.VISION_HEADS,
        "image_size": LONGEST_EDGE,
        "patch_size": PATCH,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    return Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=ids["[IMG]"],
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        spatial_merge_size=MERGE,
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )
