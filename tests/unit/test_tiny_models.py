"""Tiny test models: byte-identical rebuilds, and they load offline in transformers and vLLM."""

from __future__ import annotations

import os

# Before transformers or vLLM is imported: nothing may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.item_layout import assert_engine_gets_processor_items  # noqa: E402
from tools import tiny_models  # noqa: E402
from tools.tiny_models import (  # noqa: E402
    AUDIO_MODELS,
    MODELS,
    VISION_MODELS,
    build_model,
    cache_root,
    ensure_model,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

# Placeholder tokens for one 224x224 image: (224 / patch)^2 / merge^2, no resize needed.
EXPECTED_IMAGE_TOKENS = {"qwen2-vl": 64, "qwen2.5-vl": 64, "qwen3-vl": 49}

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
    },
]


def _image() -> Image.Image:
    return Image.new("RGB", (224, 224), (200, 40, 90))


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="session")
def models_root() -> Path:
    """The suite's shared model cache (the engines of both suites serve these copies)."""
    return cache_root()


@pytest.fixture(scope="session", params=VISION_MODELS)
def model_dir(request: pytest.FixtureRequest, models_root: Path) -> Path:
    return ensure_model(request.param, models_root)


@pytest.fixture(scope="session")
def audio_dir(models_root: Path) -> Path:
    return ensure_model("qwen2-audio", models_root)


def test_models_listed() -> None:
    assert {"qwen2-vl", "qwen3-vl", "qwen2-audio"} <= set(MODELS)
    assert set(EXPECTED_IMAGE_TOKENS) == set(VISION_MODELS)
    assert AUDIO_MODELS == ("qwen2-audio",)


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2-audio"])
def test_build_is_byte_identical(tmp_path: Path, name: str) -> None:
    build_model(name, tmp_path / "a")
    build_model(name, tmp_path / "b")
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(a)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name


def test_ensure_model_caches_and_rebuilds_when_stale(tmp_path: Path) -> None:
    path = ensure_model("qwen2-vl", tmp_path)
    assert path == tmp_path / "qwen2-vl"
    marker = path / tiny_models.MARKER
    assert marker.read_text().strip() == tiny_models.fingerprint()
    weights = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_model("qwen2-vl", tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == weights

    marker.write_text("stale\n")
    assert ensure_model("qwen2-vl", tmp_path) == path
    assert marker.read_text().strip() == tiny_models.fingerprint()
    # Only the finished folder, the lock and nothing half-built is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".qwen2-vl.lock", "qwen2-vl"]


def test_cli_prints_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tiny_models.main(["qwen2-vl", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "qwen2-vl")]
    with pytest.raises(SystemExit):
        tiny_models.main(["no-such-model", "--out", str(tmp_path)])


def test_unknown_model_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model"):
        ensure_model("llama", tmp_path)


def test_transformers_loads_processes_and_generates(model_dir: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    name = model_dir.name
    processor = AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    config = model.config

    for token, config_id in [
        ("<|image_pad|>", config.image_token_id),
        ("<|video_pad|>", config.video_token_id),
        ("<|vision_start|>", config.vision_start_token_id),
        ("<|vision_end|>", config.vision_end_token_id),
    ]:
        assert tokenizer.convert_tokens_to_ids(token) == config_id, token
    text_config = config.get_text_config()
    assert len(tokenizer) <= text_config.vocab_size
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == text_config.eos_token_id
    assert tokenizer.pad_token_id == text_config.pad_token_id
    assert tokenizer.convert_ids_to_tokens(text_config.bos_token_id) == "<|endoftext|>"
    # transformers 5 rebuilds Qwen2Tokenizer's pipeline and keeps only vocab and merges from
    # tokenizer.json; both must still split text identically.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    sample = "Hi there!  <|vision_start|><|image_pad|><|vision_end|> 12:30 naïve 日本\n<|im_end|>"
    assert tokenizer(sample)["input_ids"] == raw.encode(sample).ids
    assert tokenizer.decode(raw.encode(sample).ids) == sample

    text = processor.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a terse assistant.<|im_end|>\n")
    assert "<|vision_start|><|image_pad|><|vision_end|>What is in this picture?" in text
    assert text.endswith("<|im_start|>assistant\n")

    inputs = processor(text=[text], images=[_image()], return_tensors="pt")
    merge = processor.image_processor.merge_size
    n_image = int((inputs["input_ids"] == config.image_token_id).sum())
    assert n_image == int(inputs["image_grid_thw"].prod()) // merge**2
    assert n_image == EXPECTED_IMAGE_TOKENS[name]

    with torch.no_grad():
        logits = model(**inputs).logits
        assert logits.shape == (1, inputs["input_ids"].shape[1], text_config.vocab_size)
        assert torch.isfinite(logits).all()
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert 1 <= new.numel() <= 3
    assert int(new.max()) < text_config.vocab_size


@pytest.fixture(scope="session")
def vllm_processor(model_dir: Path):  # type: ignore[no-untyped-def]
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    # Only configs, tokenizer and processor files are read: no weights, no engine.
    model_config = ModelConfig(model=str(model_dir), max_model_len=4096, enforce_eager=True)
    return MULTIMODAL_REGISTRY.create_processor(model_config)


@pytest.mark.vllm
def test_vllm_processor_loads_offline_and_places_image(model_dir: Path, vllm_processor) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoProcessor
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    name = model_dir.name
    tokenizer = vllm_processor.info.get_tokenizer()
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    assert prompt.count(image_id) == 1

    mm_items = vllm_processor.info.parse_mm_data({"image": [_image()]})
    result = vllm_processor.apply(ProcessorInputs(prompt, mm_items), TimingContext(enabled=False))

    (placeholder,) = result["mm_placeholders"]["image"]
    expected = EXPECTED_IMAGE_TOKENS[name]
    assert placeholder.length == expected
    ids = result["prompt_token_ids"]
    assert (
        ids[placeholder.offset : placeholder.offset + placeholder.length] == [image_id] * expected
    )
    assert ids.count(image_id) == expected
    assert len(ids) == len(prompt) - 1 + expected

    assert assert_engine_gets_processor_items(vllm_processor.info.get_hf_processor(), result) > 0

    # vLLM's expansion matches the transformers processor token for token.
    hf = AutoProcessor.from_pretrained(model_dir)(text=[text], images=[_image()])
    assert ids == list(hf["input_ids"][0])


@pytest.mark.vllm
def test_vllm_processor_video_items_reach_generate_as_made(vllm_processor) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    # vLLM's video IO's metadata for such a clip, as generate's own probe sends it.
    from tandem_generate.engine import _VIDEO_METADATA, process_one

    # Four equal frames: the video's wire transforms have work to do.
    frames = np.full((4, 64, 64, 3), 90, dtype=np.uint8)
    result = process_one(vllm_processor, "video", (frames, _VIDEO_METADATA))
    assert assert_engine_gets_processor_items(vllm_processor.info.get_hf_processor(), result) > 0


# One second of audio at 16 kHz: 100 mel frames, halved twice by the encoder (vLLM's formula).
AUDIO_SECONDS, EXPECTED_AUDIO_TOKENS = 1.0, 25


def _audio():  # type: ignore[no-untyped-def]
    import numpy as np

    t = np.arange(int(16_000 * AUDIO_SECONDS)) / 16_000
    return (0.5 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)


AUDIO_MESSAGES = [
    {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is it?"}]}
]


def test_transformers_loads_audio_model_processes_and_generates(audio_dir: Path) -> None:
    from transformers import AutoModelForMultimodalLM, AutoProcessor

    processor = AutoProcessor.from_pretrained(audio_dir)
    tokenizer = processor.tokenizer
    model = AutoModelForMultimodalLM.from_pretrained(audio_dir).eval()
    config = model.config
    assert type(model).__name__ == "Qwen2AudioForConditionalGeneration"
    assert tokenizer.convert_tokens_to_ids("<|AUDIO|>") == config.audio_token_index
    assert processor.feature_extractor.sampling_rate == 16_000

    text = processor.apply_chat_template(AUDIO_MESSAGES, tokenize=False, add_generation_prompt=True)
    assert "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nWhat is it?" in text
    inputs = processor(text=[text], audio=[_audio()], sampling_rate=16_000, return_tensors="pt")
    assert int((inputs["input_ids"] == config.audio_token_index).sum()) == EXPECTED_AUDIO_TOKENS
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert 1 <= new.numel() <= 3
    assert int(new.max()) < config.get_text_config().vocab_size


@pytest.mark.vllm
def test_vllm_processor_places_audio_as_transformers_does(audio_dir: Path) -> None:
    from transformers import AutoProcessor
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    proc = MULTIMODAL_REGISTRY.create_processor(
        ModelConfig(model=str(audio_dir), max_model_len=4096, enforce_eager=True)
    )
    tokenizer = proc.info.get_tokenizer()
    text = tokenizer.apply_chat_template(AUDIO_MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    items = proc.info.parse_mm_data({"audio": [(_audio(), 16_000)]})
    result = proc.apply(ProcessorInputs(prompt, items), TimingContext(enabled=False))
    (placeholder,) = result["mm_placeholders"]["audio"]
    assert placeholder.length == EXPECTED_AUDIO_TOKENS
    assert assert_engine_gets_processor_items(proc.info.get_hf_processor(), result) > 0
    hf = AutoProcessor.from_pretrained(audio_dir)(
        text=[text], audio=[_audio()], sampling_rate=16_000
    )
    assert result["prompt_token_ids"] == list(hf["input_ids"][0])
