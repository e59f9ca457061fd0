"""Cohere2-Vision (``CohereLabs/command-a-vision-07-2025``, Aya Vision's successor): a Cohere2 text
model, a SigLIP vision tower and ``Cohere2VisionProcessor`` tiling images into up to 12 tiles and
a thumbnail.

A tile is 256x256 here (512 published): 16x16 SigLIP patches, pixel-shuffled by 2 into 8x8 = 64
placeholders (the image processor's ``patch_size`` counts placeholders per tile side), each tile's
row closed by ``<|IMG_LINE_BREAK|>``. transformers writes the SigLIP tower without its
``vision_model.`` level; the published checkpoint, and vLLM's loader, have it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens (it has them at 0-7 and 255000 on), in its order.
SPECIALS = (
    "<PAD>",
    "<UNK>",
    "<CLS>",
    "<SEP>",
    "<MASK_TOKEN>",
    "<BOS_TOKEN>",
    "<EOS_TOKEN>",
    "<EOP_TOKEN>",
    "<|START_OF_TURN_TOKEN|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|USER_TOKEN|>",
    "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    "<|START_RESPONSE|>",
    "<|END_RESPONSE|>",
    "<|START_ACTION|>",
    "<|END_ACTION|>",
    "<|START_TOOL_RESULT|>",
    "<|END_TOOL_RESULT|>",
    "<|START_OF_IMG|>",
    "<|END_OF_IMG|>",
    "<|IMG_LINE_BREAK|>",
    "<|IMG_PATCH|>",
)

# The Command A family's HF chat template (Cohere's own copy, ``cmd3-hf.jinja`` in
# cohere-ai/melody): a long default preamble, ``<|IMG_PATCH|>`` for each image part.
CHAT_TEMPLATE = r"""{%- set template_v1 = true -%}
{%- set reasoning_v1 = true if reasoning else false -%}
{%- set reasoning = false -%}
{%- set skip_thinking = skip_thinking if skip_thinking is not undefined else false -%}
{%- set convert_first_system_msg = true -%}
{%- set reasoning_v1 = reasoning_v1 if reasoning_v1 else false -%}
{%- set skip_thinking = skip_thinking if skip_thinking is not undefined else (not reasoning and not reasoning_v1) -%}
{%- set thinking_default_val = thinking_default_val | default(None) -%}
{%- set safety_mode = safety_mode if safety_mode is not undefined else "CONTEXTUAL" -%}
{%- set has_developer_preamble = developer_preamble or developer_preamble == "" -%}
{%- set convert_first_system_msg = convert_first_system_msg | default(true) -%}
{{ bos_token }}
{%- macro document_turn(documents) -%}
{# format documents into chat turn -#}
<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{%- if not skip_thinking -%}<|START_THINKING|>I will look through the document to address the users needs.<|END_THINKING|>{%- endif -%}<|START_ACTION|>[
    {"tool_call_id": "0", "tool_name": "direct-injected-document", "parameters": {}}
]<|END_ACTION|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[
    {
        "tool_call_id": "0",
        "results": {
{%- for doc in documents %}
{%- set doc_val = doc.data if doc.data else doc %}

            "{{ loop.index0 }}": {{ doc_val|tojson }}{% if not loop.last %},
            {%- endif %}
{%- endfor %}

        },
        "is_error": null
    }
]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>{%- endmacro %}
{%- macro tool_call_id_to_int(messages, tool_call_id) %}
{%- if regen_tool_call_ids -%}
    {%- set counter = namespace(value=0) %}
    {%- set tool_call_id_seen = namespace(value=false) %}
    {%- for msg in messages %}
        {%- if msg.tool_calls %}
            {%- for tool_call in msg.tool_calls %}
                {%- if tool_call.id == tool_call_id and not tool_call_id_seen.value -%}
                    {{ counter.value }}
                    {%- set tool_call_id_seen.value = true %}
                {%- endif %}
                {%- set counter.value = counter.value + 1 %}
            {%- endfor %}
        {%- endif %}
    {%- endfor %}
{%- else -%}
    {{ tool_call_id }}
{%- endif -%}
{%- endmacro %}
{%- macro format_tool_message(messages, tool_msg) -%}
{#- format tool message #}{
        "tool_call_id": "{{ tool_call_id_to_int(messages, tool_msg.tool_call_id) }}",
        "results": {
        {%- if tool_msg.content is mapping or tool_msg.content is string %}

            {% if tool_msg.content is string -%}
                {%- set text_wrapper = {"content": tool_msg.content} -%}
            {%- else -%}
                {%- set text_wrapper = tool_msg.content -%}
            {%- endif %}
            "0": {{ text_wrapper|tojson }}
        {%- else %}
            {%- for content in tool_msg.content %}

            "{{ loop.index0 }}": {{ print_tool_content(content) }}{% if not loop.last %},{% endif %}
            {%- endfor %}
        {%- endif %}

        },
        "is_error": null
    }
{%- endmacro -%}
{%- macro print_tool_content(item) %}
{%- if item.type|lower == "text" -%}
{%- set text_wrapper = {"content": item.text} -%}
{{ text_wrapper|tojson }}
{%- elif item.type|lower == "document" and item.document and "data" in item.document -%}
{{ item.document.data|tojson }}
{%- else -%}
{{ item|tojson }}
{%- endif -%}
{%- endmacro %}
{%- macro print_msg(msg) %}
    {%- if msg is string -%}
{{ msg }}
    {%- elif msg.content is string -%}
{{ msg.content }}
    {%- else %}
    {%- set last_was_text = namespace(value=false) %}
        {%- for content in msg.content %}
            {%- if content.type|lower == "text" -%}
            {%- if last_was_text.value %}{{ "\n" }}{% endif -%}
{{ content.text }}
            {%- set last_was_text.value = true -%}
            {%- else -%}
            {%- set last_was_text.value = false -%}
            {%- endif -%}
            {%- if content.type|lower == "image" -%}
                {%- if content.data -%}
{{ content.data }}
                {%- else -%}
<|IMG_PATCH|>
                {%- endif -%}
            {%- endif -%}
        {%- endfor %}
        {%- set last_was_text = false -%}
    {%- endif %}
{%- endmacro %}
{%- macro print_thinking(msg) %}
    {%- if msg.thinking -%}
{{ msg.thinking }}
    {%- elif msg.content and msg.content[0].thinking -%}
{{ msg.content[0].thinking }}
    {%- endif %}
{%- endmacro %}
{%- set json_object = true if response_format and response_format.type == "json_object" else false %}
{%- set json_schema = (response_format.json_schema or response_format.schema) if response_format %}
{%- set json_mode = json_object or json_schema %}
{%- set enable_citations = enable_citations if enable_citations is not undefined else false %}
{%- set tool_idx = namespace(value=0) %}
{%- set tool_ids_seen = namespace(value=[]) %}
{%- set regen_tool_call_ids = regen_tool_call_ids if regen_tool_call_ids is not undefined else true -%}
{%- set sent_documents = namespace(value=false) -%}
{%- if skip_preamble -%}
{% if has_developer_preamble %}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ print_msg(developer_preamble) }}<|END_OF_TURN_TOKEN|>{% endif %}
{%- else -%}
{%- if messages and messages[0]['role']|lower == 'system' and not has_developer_preamble and convert_first_system_msg %}{%- set developer_preamble = messages[0] %}{%- set initial_instruction_message = true %}{% endif %}
<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># System Preamble
{% if safety_mode != "NONE" %}
    {%- if safety_mode|upper == 'STRICT' %}
You are in strict safety mode. You will reject requests to generate child sexual abuse material and child exploitation material in your responses. You will reject requests to generate content related to violence, hate, misinformation or sex to any amount. You will avoid using profanity. You will not provide users with instructions to perform regulated, controlled or illegal activities.
    {%- else %}
You are in contextual safety mode. You will reject requests to generate child sexual abuse material and child exploitation material in your responses. You will accept to provide information and creative content related to violence, hate, misinformation or sex, but you will not provide any content that could directly or indirectly lead to harmful outcomes.
    {%- endif %}

{% endif %}

Your information cutoff date is June 2024.

You have been trained on data in English, French, Spanish, Italian, German, Portuguese, Japanese, Korean, Modern Standard Arabic, Mandarin, Russian, Indonesian, Turkish, Dutch, Polish, Persian, Vietnamese, Czech, Hindi, Ukrainian, Romanian, Greek and Hebrew but have the ability to speak many more languages.
{% if reasoning or reasoning_v1 %}

## Reasoning
Start your response by writing <|START_THINKING|>. Then slowly and carefully reason through the problem. If you notice that you've made a mistake, you can correct it. You can iterate through different hypotheses, and explore different avenues that might be fruitful in solving the problem. Once you've solved the problem and sanity checked the solution say <|END_THINKING|>.
When you are ready to respond write <|START_RESPONSE|>. Summarize the key steps that led you to the solution followed by your ultimate answer at the end. Once you are done, end your response with <|END_RESPONSE|>.
{% endif %}
{%- if tools or documents or reasoning %}

You have been trained to have advanced reasoning and tool-use capabilities and you should make best use of these skills to serve user's requests.

{% if not skip_thinking %}
## Tool Use
Think about how you can make best use of the provided tools to help with the task and come up with a high level plan that you will execute first.

0. Start by writing <|START_THINKING|> followed by a detailed step by step plan of how you will solve the problem. For each step explain your thinking fully and give details of required tool calls (if needed). Unless specified otherwise, you write your plan in natural language. When you finish, close it out with <|END_THINKING|>.
    {% if not reasoning and not reasoning_v1 %}
    You can optionally choose to skip this step when the user request is so straightforward to address that only a trivial plan would be needed.
    NOTE: You MUST skip this step when you are directly responding to the user's request without using any tools.
    {% endif %}

Then carry out your plan by repeatedly executing the following steps.
1. Action: write <|START_ACTION|> followed by a list of JSON-formatted tool calls, with each one containing "tool_name" and "parameters" fields.
    When there are multiple tool calls which are completely independent of each other (i.e. they can be executed in parallel), you should list them out all together in one step. When you finish, close it out with <|END_ACTION|>.
2. Observation: you will then receive results of those tool calls in JSON format in the very next turn, wrapped around by <|START_TOOL_RESULT|> and <|END_TOOL_RESULT|>. Carefully observe those results and think about what to do next. Note that these results will be provided to you in a separate turn. NEVER hallucinate results.
    Every tool call produces a list of results (when a tool call produces no result or a single result, it'll still get wrapped inside a list). Each result is clearly linked to its originating tool call via its "tool_call_id".
3. Reflection: start the next turn by writing <|START_THINKING|> followed by what you've figured out so far, any changes you need to make to your plan, and what you will do next. When you finish, close it out with <|END_THINKING|>.
    {% if not reasoning and not reasoning_v1 %}
    You can optionally choose to skip this step when everything is going according to plan and no special pieces of information or reasoning chains need to be recorded.
    NOTE: You MUST skip this step when you are done with tool-use actions and are ready to respond to the user.
    {% endif %}

You can repeat the above 3 steps multiple times (could be 0 times too if no suitable tool calls are available or needed), until you decide it's time to finally respond to the user.

4. Response: then break out of the loop and write <|START_RESPONSE|> followed by a piece of text which serves as a response to the user's last request. Use all previous tool calls and results to help you when formulating your response. When you finish, close it out with <|END_RESPONSE|>.
{% else %}
## Tool Use
Carry out the task by repeatedly executing the following steps.
1. Action: write <|START_ACTION|> followed by a list of JSON-formatted tool calls, with each one containing "tool_name" and "parameters" fields.
    When there are multiple tool calls which are completely independent of each other (i.e. they can be executed in parallel), you should list them out all together in one step. When you finish, close it out with <|END_ACTION|>.
2. Observation: you will then receive results of those tool calls in JSON format in the very next turn, wrapped around by <|START_TOOL_RESULT|> and <|END_TOOL_RESULT|>. Carefully observe those results and think about what to do next. Note that these results will be provided to you in a separate turn. NEVER hallucinate results.
    Every tool call produces a list of results (when a tool call produces no result or a single result, it'll still get wrapped inside a list). Each result is clearly linked to its originating tool call via its "tool_call_id".

You can repeat the above 2 steps multiple times (could be 0 times too if no suitable tool calls are available or needed), until you decide it's time to finally respond to the user.

3. Response: then break out of the loop and write <|START_RESPONSE|> followed by a piece of text which serves as a response to the user's last request. Use all previous tool calls and results to help you when formulating your response. When you finish, close it out with <|END_RESPONSE|>.
{% endif %}
{%- if enable_citations %}

## Grounding
Importantly, note that {% if not skip_thinking %}"Reflection" and {% endif %}"Response" above can be grounded.
Grounding means you associate pieces of texts (called "spans") with those specific tool results that support them (called "sources"). And you use a pair of tags "<co>" and "</co>" to indicate when a span can be grounded onto a list of sources, listing them out in the closing tag. Sources from the same tool call are grouped together and listed as "{tool_call_id}:[{list of result indices}]", before they are joined together by ",". E.g., "<co>span</co: 0:[1,2],1:[0]>" means that "span" is supported by result 1 and 2 from "tool_call_id=0" as well as result 0 from "tool_call_id=1".
{% endif %}

## Available Tools
Here is the list of tools that you have available to you.
You can ONLY use the tools listed here. When a tool is not listed below, it is NOT available and you should NEVER attempt to use it.
Each tool is represented as a JSON object with fields like "name", "description", "parameters" (per JSON Schema), and optionally, "responses" (per JSON Schema).

```json
[
{%- if documents %}

    {"name": "direct-injected-document", "description": "This is a special tool to directly inject user-uploaded documents into the chat as additional context. DO NOT use this tool by yourself!", "parameters": {"type": "object", "properties": {}, "required": []}, "responses": {"200": {"description": "Successfully returned a list of chunked text snippets from the directly uploaded documents.", "content": {"application/json": {"schema": {"type": "array", "items": {"type": "object", "required": ["url", "snippet"], "properties": {"url": {"type": "string", "description": "The url of the uploaded document."}, "snippet": {"type": "string", "description": "The text snippet for the returned document chunk."}}}}}}}}}{%- if tools %},{% endif %}
{%- endif %}
{%- if tools %}
{%- for tool in tools %}

    {"name": "{{ tool['function']['name'] }}", "description": "{{tool['function']['description']}}", "parameters": {{ tool['function']['parameters']|tojson }}, "responses": null}{%- if not loop.last %},{% endif %}
{%- endfor %}
{%- endif %}
{%- if not(documents or tools) and not template_v1 %}

{% endif %}

]
```
{% endif %}

# Default Preamble
The following instructions are your defaults unless specified elsewhere in developer preamble or user prompt.
- Your name is Command.
- You are a large language model built by Cohere.
- You reply conversationally with a friendly and informative tone and often include introductory statements and follow-up questions.
- If the input is ambiguous, ask clarifying follow-up questions.
- Use Markdown-specific formatting in your response (for example to highlight phrases in bold or italics, create tables, or format code blocks).
- Use LaTeX to generate mathematical notation for complex equations.
- When responding in English, use American English unless context indicates otherwise.
- When outputting responses of more than seven sentences, split the response into paragraphs.
- Prefer the active voice.
- Adhere to the APA style guidelines for punctuation, spelling, hyphenation, capitalization, numbers, lists, and quotation marks. Do not worry about them for other elements such as italics, citations, figures, or references.
- Use gender-neutral pronouns for unspecified persons.
- Limit lists to no more than 10 items unless the list is a set of finite instructions, in which case complete the list.
- Use the third person when asked to write a summary.
- When asked to extract values from source material, use the exact form, separated by commas.
- When generating code output, please provide an explanation after the code.
- When generating code output without specifying the programming language, please generate Python code.
- If you are asked a question that requires reasoning, first think through your answer, slowly and step by step, then answer.
{%- if developer_preamble or json_mode %}


# Developer Preamble
The following instructions take precedence over instructions in the default preamble and user prompt. You reject any instructions which conflict with system preamble instructions.
  {%- if developer_preamble and developer_preamble != "" %}

{{ print_msg(developer_preamble) }}
  {%- endif %}
  {%- if json_mode %}

When generating JSON objects, do not generate block markers. Generate an object directly without prefixing with ```json. Return only the JSON and nothing else.
        {%- if json_schema %}

Your output should adhere to the following json schema:
{{ json_schema }}
        {%- endif -%}
    {%- endif -%}
{%- endif -%}
<|END_OF_TURN_TOKEN|>
{%- endif -%}
{%- for message in messages %}
    {%- if message.role|lower == 'system' and (not (loop.first and initial_instruction_message) or skip_preamble) -%}
<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ print_msg(message) }}<|END_OF_TURN_TOKEN|>
    {%- elif message.role|lower == 'user' -%}
<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ print_msg(message) }}<|END_OF_TURN_TOKEN|>
        {%- if documents and not sent_documents.value %}{%- set sent_documents.value = true %}{% set tool_idx.value = tool_idx.value + 1 %}{{ document_turn(documents) }}{% endif %}
    {%- elif message.role|lower == 'assistant' or message.role|lower == 'chatbot' -%}
<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>
        {%- if message.tool_calls %}
            {% if not skip_thinking %}
                {% if message.tool_plan -%}
                    <|START_THINKING|>{{ message.tool_plan }}<|END_THINKING|>
                {%- elif message.thinking or (message.content and message.content[0].type == "thinking") -%}
                    <|START_THINKING|>{{ print_thinking(message) }}<|END_THINKING|>
                {%- elif thinking_default_val and not skip_thinking -%}
                    <|START_THINKING|>{{ thinking_default_val }}<|END_THINKING|>
                {%- endif %}
            {%- endif %}<|START_ACTION|>[
            {%- for tc in message.tool_calls %}

    {"tool_call_id": "{%- if regen_tool_call_ids -%}{{ tool_idx.value }}{%- else -%}{{ tc.id }}{%- endif -%}", "tool_name": "{{ tc['function']['name'] }}", "parameters": {{ tc['function']['arguments']|tojson }}}{% if not loop.last %},{% endif %}
                {%- set tool_idx.value = tool_idx.value + 1 %}
            {%- endfor %}

]<|END_ACTION|><|END_OF_TURN_TOKEN|>
        {%- else -%}
            {% if (message.thinking or (message.content and message.content[0].type == "thinking")) and not skip_thinking -%}
                <|START_THINKING|>{{ print_thinking(message) }}<|END_THINKING|>
            {%- elif thinking_default_val and not skip_thinking -%}
                <|START_THINKING|>{{ thinking_default_val }}<|END_THINKING|>
            {%- endif -%}
            <|START_RESPONSE|>{{ print_msg(message) }}<|END_RESPONSE|><|END_OF_TURN_TOKEN|>
        {%- endif %}
    {%- elif message.role|lower == 'tool' and message.tool_call_id not in tool_ids_seen.value -%}
<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[
    {{ format_tool_message(messages, message) }}
        {%- for msg in messages[loop.index0 + 1:] %}

            {%- if msg.role|lower == 'tool' %},
    {{ format_tool_message(messages, msg) }}
                {%- set tool_ids_seen.value = tool_ids_seen.value + [msg.tool_call_id] %}
            {%- else %}
                {%- break %}
            {%- endif %}
        {%- endfor %}

]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>
    {%- endif %}
{%- endfor %}{%- if add_generation_prompt -%}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ response_prefix }}{%- endif %}
"""  # noqa: E501

TILE = 256
SIGLIP_PATCH = 16
DOWNSAMPLE = 2
TOKENS_PER_SIDE = TILE // SIGLIP_PATCH // DOWNSAMPLE


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<BOS_TOKEN>",
            "eos_token": "<|END_OF_TURN_TOKEN|>",
            "pad_token": "<PAD>",
            "unk_token": "<UNK>",
            "cls_token": "<CLS>",
            "sep_token": "<SEP>",
            "mask_token": "<MASK_TOKEN>",
            "padding_side": "left",
            # Cohere2VisionProcessor reads these names off the tokenizer.
            "extra_special_tokens": {
                "boi_token": "<|START_OF_IMG|>",
                "eoi_token": "<|END_OF_IMG|>",
                "image_token": "<|IMG_PATCH|>",
                "img_line_break_token": "<|IMG_LINE_BREAK|>",
            },
        },
    )
    _processor_files(out)
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<BOS_TOKEN>"],
            "eos_token_id": ids["<|END_OF_TURN_TOKEN|>"],
            "pad_token_id": ids["<PAD>"],
        },
        rename=_published_name,
    )


def _published_name(name: str) -> str:
    """``model.vision_tower.X`` -> ``model.vision_tower.vision_model.X``."""
    tower = "model.vision_tower."
    if name.startswith(tower) and not name.startswith(tower + "vision_model."):
        return tower + "vision_model." + name[len(tower) :]
    return name


def _processor_files(out: Path) -> None:
    common.write_json(
        out / "preprocessor_config.json",
        {
            "crop_to_patches": True,
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "Cohere2VisionImageProcessorFast",
            "image_std": [0.5, 0.5, 0.5],
            "max_patches": 12,
            "min_patches": 1,
            "patch_size": TOKENS_PER_SIDE,
            "processor_class": "Cohere2VisionProcessor",
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"height": TILE, "width": TILE},
        },
    )
    common.write_json(out / "processor_config.json", {"processor_class": "Cohere2VisionProcessor"})


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Cohere2VisionConfig

    text = {
        "model_type": "cohere2",
        "architectures": ["Cohere2ForCausalLM"],
        "vocab_size": common.VOCAB_SIZE,
        "hidden_size": common.HIDDEN,
        "intermediate_size": common.INTERMEDIATE,
        "num_hidden_layers": common.TEXT_LAYERS,
        "num_attention_heads": common.HEADS,
        "num_key_value_heads": common.KV_HEADS,
        "head_dim": common.HEAD_DIM,
        "max_position_embeddings": common.MAX_POSITIONS,
        "logit_scale": 0.25,
        "layer_norm_eps": 1e-5,
        # The published 3-sliding-then-1-full pattern, cut to two layers.
        "sliding_window": 4096,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
        "bos_token_id": ids["<BOS_TOKEN>"],
        "eos_token_id": ids["<|END_OF_TURN_TOKEN|>"],
        "pad_token_id": ids["<PAD>"],
        "tie_word_embeddings": True,
        "dtype": common.DTYPE,
    }
    vision = {
        "model_type": "siglip_vision_model",
        **common.vision_sizes(),
        "image_size": TILE,
        "patch_size": SIGLIP_PATCH,
        "vision_use_head": False,
    }
    return Cohere2VisionConfig(
        text_config=text,
        vision_config=vision,
        downsample_factor=DOWNSAMPLE,
        image_token_id=ids["<|IMG_PATCH|>"],
        alignment_intermediate_size=2 * common.HIDDEN,
        tie_word_embeddings=True,
        dtype=common.DTYPE,
    )
