"""Tiny BLIP-2, shaped as ``Salesforce/blip2-opt-2.7b`` (``Blip2ForConditionalGeneration`` with
``Blip2Processor``): a ViT whose patches a Q-Former reads through 32 learned queries, projected
into an OPT language model as 32 ``<image>`` tokens put before the prompt. One image per prompt
(vLLM's limit). No chat template is published: ``vllm serve`` falls back to its own for
``blip-2`` ("Question: ... Answer:"), so this checkpoint ships none either."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# OPT's specials (GPT-2's byte-level BPE with these four first in the published vocabulary) and
# the image token the processor expands (added last, as published).
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<image>")
# 32 queries as published; a one-layer Q-Former that cross-attends the tower (every 2nd layer
# does, the first included).
QUERY_TOKENS = 32
IMAGE_SIZE = 224
PATCH = 14


def build(out_dir: Path) -> None:
    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        "",
        {
            # OPT puts </s> first as its BOS; the tokenizer's post-processor does so (below).
            "add_bos_token": True,
            "bos_token": "</s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "</s>",
            "errors": "replace",
            "tokenizer_class": "GPT2Tokenizer",
        },
    )
    # Nothing published: vLLM's fallback template is the one chats get.
    (out_dir / "chat_template.jinja").unlink()
    newline = _prepend_bos(out_dir, "</s>", ids["</s>"])
    _processor_files(out_dir)
    common.save_random_model(
        _config(ids, newline),
        out_dir,
        {"bos_token_id": ids["</s>"], "eos_token_id": newline, "pad_token_id": ids["<pad>"]},
    )


def _prepend_bos(out: Path, bos: str, bos_id: int) -> int:
    """Give ``tokenizer.json`` OPT's post-processor (``bos`` before every text, as the published
    fast tokenizer adds it) and return the newline's id (OPT-2.7b's BLIP-2 stops there)."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    newline = tok.token_to_id("Ċ")
    if newline is None:
        raise RuntimeError("the tiny vocabulary lacks the newline token")
    return int(newline)


def _processor_files(out: Path) -> None:
    common.write_json(
        out / "preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": common.OPENAI_CLIP_MEAN,
            "image_processor_type": "BlipImageProcessor",
            "image_std": common.OPENAI_CLIP_STD,
            "processor_class": "Blip2Processor",
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        },
    )
    common.write_json(
        out / "processor_config.json",
        {"num_query_tokens": QUERY_TOKENS, "processor_class": "Blip2Processor"},
    )


def _config(ids: dict[str, int], newline: int) -> PreTrainedConfig:
    from transformers import Blip2Config

    sizes = common.text_sizes()
    text = {
        "model_type": "opt",
        "vocab_size": sizes["vocab_size"],
        "hidden_size": sizes["hidden_size"],
        "word_embed_proj_dim": sizes["hidden_size"],
        "ffn_dim": sizes["intermediate_size"],
        "num_hidden_layers": sizes["num_hidden_layers"],
        "num_attention_heads": sizes["num_attention_heads"],
        "max_position_embeddings": sizes["max_position_embeddings"],
        "activation_function": "relu",
        "do_layer_norm_before": True,
        "bos_token_id": ids["</s>"],
        "eos_token_id": newline,
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }
    vision = {
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "layer_norm_eps": 1e-6,
        "qkv_bias": True,
    }
    qformer = {
        "hidden_size": common.VISION_WIDTH,
        "num_hidden_layers": 1,
        "num_attention_heads": common.VISION_HEADS,
        "intermediate_size": 2 * common.VISION_WIDTH,
        "cross_attention_frequency": 2,
        "encoder_hidden_size": common.VISION_WIDTH,
    }
    return Blip2Config(
        vision_config=vision,
        qformer_config=qformer,
        text_config=text,
        num_query_tokens=QUERY_TOKENS,
        image_token_index=ids["<image>"],
        dtype=common.DTYPE,
    )
