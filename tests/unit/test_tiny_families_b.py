"""Tiny InternVL (HF), Mistral 3, GLM-4.1V and Cohere2-Vision models: byte-identical rebuilds,
and vLLM's own processor (configs, tokenizer and processor files only: no weights, no engine)
places one image's placeholders in a prompt their chat template rendered, and its items reach
generate's engine inputs as it made them."""

from __future__ import annotations

import os

# Before transformers or vLLM is imported: nothing may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.item_layout import assert_engine_gets_processor_items  # noqa: E402
from tools.tiny_families import FAMILIES  # noqa: E402
from tools.tiny_models import MARKER, build_model, ensure_model  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

# Embedding positions of one 224x224 image: one 224 tile of (224/14)^2 patches pixel-shuffled by
# 2 (InternVL); 8x8 merged 28-pixel patches (Mistral 3, GLM-4.1V); one 256 tile of 16x16 SigLIP
# patches shuffled by 2 (Cohere2-Vision). `extra`: the placeholder's tokens that are not image
# features (InternVL's <img> </img>; Mistral's [IMG_BREAK] x7 and [IMG_END]; Cohere's
# <|START_OF_IMG|>, one <|IMG_LINE_BREAK|>, <|END_OF_IMG|>).
EXPECTED = {
    "internvl-hf": {"embeds": 64, "extra": 2, "image_token": "<IMG_CONTEXT>"},
    "mistral3": {"embeds": 64, "extra": 8, "image_token": "[IMG]"},
    "glm4.1v": {"embeds": 64, "extra": 0, "image_token": "<|image|>"},
    "cohere2-vision": {"embeds": 64, "extra": 3, "image_token": "<|IMG_PATCH|>"},
}

MESSAGES = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
    },
]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def test_families_listed() -> None:
    # That every family is this module's or the twin's: test_tiny_families.py.
    assert FAMILIES["internvl-hf"].modalities == ("image", "video")
    assert FAMILIES["glm4.1v"].modalities == ("image", "video")


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    """Family ``request.param`` built twice, in the suite's shared cache (by this process or
    another, maybe in an earlier run; the family suite serves that copy) and afresh here: its
    name and both folders. The test below checks they are equal."""
    fresh = tmp_path_factory.mktemp("family") / request.param
    build_model(request.param, fresh)
    return request.param, ensure_model(request.param), fresh


def test_build_is_byte_identical(built: tuple[str, Path, Path]) -> None:
    _, cached, fresh = built
    a, b = _tree(cached), _tree(fresh)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(a)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name


@pytest.mark.vllm
def test_vllm_processor_places_one_image(built: tuple[str, Path, Path]) -> None:
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    name, model_dir, _ = built
    want = EXPECTED[name]
    config = ModelConfig(model=str(model_dir), max_model_len=4096, enforce_eager=True)
    assert config.architectures == [FAMILIES[name].architecture]
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    tokenizer = processor.info.get_tokenizer()
    image_id = tokenizer.convert_tokens_to_ids(want["image_token"])

    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    image = Image.new("RGB", (224, 224), (200, 40, 90))
    mm_items = processor.info.parse_mm_data({"image": [image]})
    result = processor.apply(ProcessorInputs(prompt, mm_items), TimingContext(enabled=False))
    assert assert_engine_gets_processor_items(processor.info.get_hf_processor(), result) > 0

    (placeholder,) = result["mm_placeholders"]["image"]
    assert placeholder.get_num_embeds() == want["embeds"]
    assert placeholder.length == want["embeds"] + want["extra"]
    ids = result["prompt_token_ids"]
    assert ids.count(image_id) == want["embeds"]
    run = ids[placeholder.offset : placeholder.offset + placeholder.length]
    assert run.count(image_id) == want["embeds"]
