"""Tiny PaliGemma 2, shaped as ``google/paligemma2-3b-mix-224``: a SigLIP tower (its last layer,
every patch) through one linear projector, and a Gemma 2 language model (sliding and global
attention layers, soft-capped logits, tied embeddings). vLLM counts ``paligemma`` among its
prefix-LM models: the image tokens attend both ways where its attention backend can mask so.

No chat template is published: ``vllm serve`` renders chats with its own fallback for the
``paligemma`` model type (every message's text, concatenated), and vLLM's processor puts the
image tokens and ``<bos>`` first and a newline last, the prompt format PaliGemma was trained on.
"""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common, gemma3

# Gemma's specials and runs of newlines (vLLM's processor looks up "\n" as a single token), the
# location and segmentation tokens of detection and segmentation answers (plain added tokens, as
# PaliGemmaProcessor adds them when they are missing), then the image token, last as in the
# real vocabulary (257152).
LOCATIONS = tuple(f"<loc{i:0>4}>" for i in range(1024))
SEGMENTS = tuple(f"<seg{i:0>3}>" for i in range(128))
SPECIALS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    *gemma3.NEWLINES,
    *LOCATIONS,
    *SEGMENTS,
    "<image>",
)
# The shared BPE keeps its usual size; the location and segmentation tokens come on top.
VOCAB_SIZE = common.VOCAB_SIZE + len(LOCATIONS) + len(SEGMENTS)
# 112 px at patch 14: an 8x8 grid, 64 image tokens per image (the real 224 px gives 256).
IMAGE_SIZE = 112
PATCH = 14
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2
SIGLIP_NORM = [0.5, 0.5, 0.5]


def _tokenizer(out: Path) -> dict[str, int]:
    """The tokenizer files, without a chat template (none is published)."""
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        "",
        {
            # PaliGemma 2's tokenizer adds no <bos>: the processor places it after the image.
            "add_bos_token": False,
            "add_eos_token": False,
            "additional_special_tokens": ["<image>"],
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "processor_class": "PaliGemmaProcessor",
            "spaces_between_special_tokens": False,
        },
        vocab_size=VOCAB_SIZE,
    )
    # write_tokenizer always writes a template; vLLM's fallback applies only without one.
    (out / "chat_template.jinja").unlink()
    common.mark_plain(out, gemma3.NEWLINES + LOCATIONS + SEGMENTS)
    return ids


def _text_config(ids: dict[str, int]) -> dict[str, object]:
    """Gemma 2 at the shared text sizes, with the published activation and soft caps."""
    return {
        "model_type": "gemma2",
        **common.text_sizes(),
        "vocab_size": VOCAB_SIZE,
        "head_dim": common.HEAD_DIM,
        "query_pre_attn_scalar": common.HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh",
        # One local (sliding) and one global layer: Gemma 2 alternates them.
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": ids["<bos>"],
        "eos_token_id": ids["<eos>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }


def build(out_dir: Path) -> None:
    from transformers import PaliGemmaConfig

    ids = _tokenizer(out_dir)
    common.write_json(
        out_dir / "preprocessor_config.json",
        {
            "do_convert_rgb": None,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": SIGLIP_NORM,
            "image_processor_type": "SiglipImageProcessor",
            "image_seq_length": TOKENS_PER_IMAGE,
            "image_std": SIGLIP_NORM,
            "processor_class": "PaliGemmaProcessor",
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        },
    )
    vision = {
        "model_type": "siglip_vision_model",
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "num_image_tokens": TOKENS_PER_IMAGE,
        "vision_use_head": False,
    }
    config = PaliGemmaConfig(
        vision_config=vision,
        text_config=_text_config(ids),
        image_token_index=ids["<image>"],
        vocab_size=VOCAB_SIZE,
        projection_dim=common.HIDDEN,
        hidden_size=common.HIDDEN,
        dtype=common.DTYPE,
    )
    common.save_random_model(
        config,
        out_dir,
        {"bos_token_id": ids["<bos>"], "eos_token_id": ids["<eos>"], "pad_token_id": ids["<pad>"]},
        rename=common.llava_hf_layout,
    )
