"""The tiny checkpoints of the families beyond Qwen: byte-identical rebuilds, and vLLM's own
processor (no engine) places each image (and video) as the real model's would; its items reach
generate's engine inputs as it made them (``tests.support.item_layout``)."""

from __future__ import annotations

import os

# Before transformers or vLLM is imported: nothing may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from tests.support.item_layout import assert_engine_gets_processor_items  # noqa: E402
from tools.tiny_families import FAMILIES  # noqa: E402
from tools.tiny_models import MARKER, build_model, cache_root, ensure_model  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402


@pytest.fixture(scope="module")
def models_root() -> Path:
    """The suite's shared model cache: what is built here the family suite serves, and the
    rebuild below is compared with a build of another process, maybe of an earlier run."""
    return cache_root()


# For one 224x224 image: the image token as the processor names it, how many positions its
# placeholder spans and how many of them take image embeddings.
IMAGE_PLACEHOLDER = {
    # CLIP 112 px at patch 14: 8x8 patches, CLS dropped.
    "llava-1.5": ("<image>", 64, 64),
    # A 2x2 grid of tiles: the 8x8 base view, 16x16 tile features and a newline after each row.
    "llava-next": ("<image>", 336, 336),
    # anyres_max_9 over 2x2 tiles, as LLaVA-NeXT plus the base view.
    "llava-onevision": ("<image>", 336, 336),
    # "\n\n<start_of_image>" + 16 soft tokens + "<end_of_image>\n\n", only the soft tokens embed.
    "gemma3": ("<image_soft_token>", 20, 16),
    # Upscaled to the 448 px bound: 4x4 tiles and the global view, 16 tokens each, framed by
    # tile tags and fake tokens.
    "idefics3": ("<image>", 312, 272),
}
# Eight 112 px frames pooled to 4x4 each, and one newline for the video.
VIDEO_PLACEHOLDER = {"llava-onevision": ("<video>", 129, 129)}


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def _image() -> Image.Image:
    return Image.new("RGB", (224, 224), (200, 40, 90))


def _video() -> Any:
    import numpy as np

    return np.full((8, 224, 224, 3), 100, dtype=np.uint8)


def test_every_family_is_covered() -> None:
    # The first families keep these fast checks, each in this module or the twin, never both;
    # every family (these too) is proven against vllm serve by test_family_parity, whose
    # render parity checks each placeholder against upstream render's.
    from tests.unit.test_tiny_families_b import EXPECTED as TWINS

    owned = set(IMAGE_PLACEHOLDER)
    assert owned | set(TWINS) <= set(FAMILIES)
    assert not owned & set(TWINS)
    assert {n for n in owned if "video" in FAMILIES[n].modalities} == set(VIDEO_PLACEHOLDER)


@pytest.mark.parametrize("name", list(IMAGE_PLACEHOLDER))
def test_build_is_byte_identical(models_root: Path, tmp_path: Path, name: str) -> None:
    cached = _tree(ensure_model(name, models_root))
    build_model(name, tmp_path / name)
    again = _tree(tmp_path / name)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(
        cached
    )
    assert sorted(cached) == sorted(again)
    for file in cached:
        assert cached[file] == again[file], file


def _placeholders(model_dir: Path, media: dict[str, Any], content: list[dict[str, Any]]) -> Any:
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    # Only configs, tokenizer and processor files are read: no weights, no engine.
    processor = MULTIMODAL_REGISTRY.create_processor(
        ModelConfig(model=str(model_dir), max_model_len=4096, enforce_eager=True)
    )
    tokenizer = processor.info.get_tokenizer()
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": "Describe it."}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    items = processor.info.parse_mm_data(media)
    result = processor.apply(ProcessorInputs(prompt, items), TimingContext(enabled=False))
    # What generate hands the engine for these items is what this processor made.
    assert assert_engine_gets_processor_items(processor.info.get_hf_processor(), result) > 0
    return tokenizer, result


def _check(tokenizer: Any, result: Any, modality: str, expected: tuple[str, int, int]) -> None:
    token, length, embeds = expected
    (placeholder,) = result["mm_placeholders"][modality]
    assert placeholder.length == length
    span = result["prompt_token_ids"][placeholder.offset : placeholder.offset + length]
    token_id = tokenizer.convert_tokens_to_ids(token)
    assert span.count(token_id) == embeds
    if placeholder.is_embed is not None:
        assert int(placeholder.is_embed.sum()) == embeds
    assert result["prompt_token_ids"].count(token_id) == embeds


@pytest.mark.vllm
@pytest.mark.parametrize("name", list(IMAGE_PLACEHOLDER))
def test_vllm_processor_places_one_image(models_root: Path, name: str) -> None:
    pytest.importorskip("vllm")
    model_dir = ensure_model(name, models_root)
    tokenizer, result = _placeholders(model_dir, {"image": [_image()]}, [{"type": "image"}])
    _check(tokenizer, result, "image", IMAGE_PLACEHOLDER[name])


@pytest.mark.vllm
@pytest.mark.parametrize("name", list(VIDEO_PLACEHOLDER))
def test_vllm_processor_places_one_video(models_root: Path, name: str) -> None:
    pytest.importorskip("vllm")
    model_dir = ensure_model(name, models_root)
    tokenizer, result = _placeholders(model_dir, {"video": [_video()]}, [{"type": "video"}])
    _check(tokenizer, result, "video", VIDEO_PLACEHOLDER[name])
