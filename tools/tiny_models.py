"""Build tiny random-weight vision- and audio-language models offline and deterministically
(the Qwen models here, the other families in ``tools.tiny_families``)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from tools.tiny_families import FAMILIES, builder, module_paths

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

ROOT = Path(__file__).resolve().parent.parent
CACHE_ENV = "TANDEM_MODEL_CACHE"
MARKER = ".tandem-tiny-model"
SEED = 0

# Text sizes shared by every architecture. head_dim = 128 / 4 = 32, so M-RoPE sections must sum
# to 16 (half the head dim).
HIDDEN = 128
TEXT_LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 256
MAX_POSITIONS = 4096
VISION_WIDTH = 64
VISION_HEADS = 2
# As the real checkpoints ship; vLLM's dtype "auto" then serves bfloat16 on CPU too.
DTYPE = "bfloat16"

# The BPE model gets the first ids and the special tokens the last ones, as in the real Qwen
# vocabularies; a full vocabulary keeps the special ids fixed (1016..1023 for the vision models).
VOCAB_SIZE = 1024
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
AUDIO_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|AUDIO|>",
)

# Qwen2Tokenizer rebuilds its pipeline from this regex plus NFC and byte-level steps on load
# (transformers 5 keeps only vocab and merges from tokenizer.json), so training must use the same.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The Qwen2-VL chat template: default system prompt, string or list content, image and video parts.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Fixed training text: varied enough for the BPE trainer to fill the whole vocabulary.
CORPUS = """\
You are a helpful assistant. Describe the image in one sentence. What is shown in this picture?
The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden fence.
A small red boat drifts across the quiet lake at sunrise, and two ducks follow it toward the shore.
The city skyline glows at night; thousands of windows shine above the busy streets and bridges.
Please summarize the following document in three short paragraphs and list the key numbers.
How many people are standing near the bus stop? There are four people, and one holds an umbrella.
The kitchen table holds a bowl of green apples, a loaf of bread, two cups of coffee and a newspaper.
Scientists measured the temperature of the river every morning for twelve weeks during the summer.
The train leaves the station at half past seven and arrives in the mountains before lunch time.
Children played football in the park until the rain started and everyone ran under the trees.
This chart compares the monthly sales of bicycles, scooters and electric cars over two years.
The museum opened a new exhibition about ancient maps, navigation tools and early astronomy.
My grandmother grows tomatoes, peppers, onions, carrots and sunflowers in her backyard garden.
The video shows a cat chasing a ball of yarn across the living room floor and under the sofa.
Answer the question using only the information visible in the photograph, and be precise.
The engineer explained how the bridge carries heavy trucks by spreading the weight over cables.
In the forest, tall pine trees cast long shadows, and a narrow path winds between the rocks.
The restaurant menu offers soup, salad, grilled fish, roasted chicken, pasta and chocolate cake.
A yellow taxi waits at the corner while a cyclist passes and a dog barks at the pigeons nearby.
The report describes revenue growth, operating costs, new customers and plans for next year.
Snow covered the village overnight, so the school closed and the children built a snowman.
The painting shows a woman reading a letter beside a window, with soft light on her face.
Our team reviewed the code, fixed three bugs, wrote new tests and improved the documentation.
The airplane climbed above the clouds, turned east, and the pilot announced a smooth flight.
At the market, farmers sell fresh eggs, honey, cheese, flowers, herbs and homemade jam.
The weather forecast predicts strong wind, heavy rain and cooler temperatures on Friday.
Identify every object on the desk: a laptop, a lamp, a notebook, a pen, keys and a phone.
The orchestra played a symphony, and the audience stood up to applaud at the very end.
Water boils at one hundred degrees Celsius at sea level, but at lower temperatures on mountains.
The library is open from nine in the morning until eight in the evening, except on holidays.
She carefully folded the map, packed her camera, and walked toward the lighthouse on the hill.
The doctor recommended more sleep, regular exercise, fresh vegetables and plenty of water.
Two horses graze in a green meadow beside a stone wall, and a tractor works in the distance.
The teacher wrote a long equation on the board and asked the students to solve it together.
During the storm, the power went out, so the family lit candles and played board games.
The spacecraft collected samples of dust and ice from the comet and sent images back home.
Read the sign on the building and translate it into English, keeping the original meaning.
The bakery smells of warm bread, cinnamon rolls and butter cookies every single morning.
A large crowd gathered in the square to watch fireworks explode in bright colors overhead.
The software update improves battery life, adds dark mode and fixes a problem with alerts.
Which of these shapes is a triangle, which is a circle, and which one is a square?
The hikers reached the summit after five hours, then rested and enjoyed the wide valley view.
Her brother repaired the broken chair with glue, small nails and a piece of strong wire.
The ocean waves crashed against the cliffs, and seagulls circled above the fishing boats.
Count the number of cars in the parking lot and tell me the color of the largest truck.
The festival featured music, dancing, street food, colorful costumes and a long parade.
Students should submit their projects by Monday, including charts, sources and conclusions.
A gentle breeze moved the curtains while the kettle whistled quietly in the small kitchen.
The detective noticed muddy footprints, an open drawer and a missing silver watch.
Economists expect prices to rise slowly, while wages and employment remain fairly stable.
The zoo keeper fed the giraffes, elephants, zebras, penguins and a very hungry bear.
Look at the diagram and explain how the water cycle moves rain from the sea to the rivers.
Every evening the old man walks his dog along the canal and greets his neighbors politely.
The company hired twenty new workers to build furniture, windows, doors and kitchen cabinets.
Thank you for your question. Here is a short answer, followed by a detailed explanation.
Numbers and symbols: 0 1 2 3 4 5 6 7 8 9, 10%, $25.99, 3.14, 2024-05-17, 12:30, #42, (a+b)*c.
"""

GLOSSARY = """\
apple banana cherry garden window mountain river forest ocean desert island valley village city
street bridge tower castle church school office market station airport harbor library museum
house kitchen bedroom bathroom garage table chair sofa lamp clock mirror picture camera phone
computer keyboard screen printer paper pencil book letter message story poem song music movie
picture image video frame pixel color shape circle square triangle line point corner edge center
left right top bottom front back inside outside above below between behind near far small large
red orange yellow green blue purple pink brown black white gray silver golden bright dark light
happy sad angry calm quiet loud fast slow early late young old new fresh clean dirty warm cold
morning afternoon evening night today yesterday tomorrow week month year season spring autumn
winter summer january february march april may june july august september october november
december monday tuesday wednesday thursday friday saturday sunday hour minute second moment
man woman child baby teacher student doctor nurse driver pilot farmer worker artist writer
dog cat bird fish horse cow sheep goat chicken duck rabbit mouse lion tiger bear wolf fox deer
walk run jump swim climb drive ride fly sing dance read write draw paint cook eat drink sleep
open close start stop begin finish give take bring carry push pull throw catch hold drop find
think know believe remember forget understand explain describe answer question problem result
because however therefore although whether unless while during after before since until
first second third last next previous several many few some every each both either neither
"""


# The Qwen2-Audio chat template: "Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>" per audio part.
AUDIO_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Whisper's log-mel front end as Qwen2-Audio ships it: 16 kHz, 128 bins, 30 s windows.
AUDIO_SAMPLE_RATE = 16_000
MEL_BINS = 128
AUDIO_WIDTH = 64


def _corpus() -> list[str]:
    return [line for line in (CORPUS + GLOSSARY).splitlines() if line.strip()]


# Per-architecture configuration. `patch` and `factor` drive the image sizes; pixel bounds keep a
# 224x224 image unresized (64 tokens at patch 14, 49 at patch 16) and cap any image at 1280 tokens,
# well inside MAX_POSITIONS.
SPECS: dict[str, dict[str, Any]] = {
    "qwen2-vl": {
        "processor": "Qwen2VLProcessor",
        "video_processor": "Qwen2VLVideoProcessor",
        "patch": 14,
        "clip_norm": True,
    },
    "qwen2.5-vl": {
        "processor": "Qwen2_5_VLProcessor",
        "video_processor": "Qwen2VLVideoProcessor",
        "patch": 14,
        "clip_norm": True,
    },
    "qwen3-vl": {
        "processor": "Qwen3VLProcessor",
        "video_processor": "Qwen3VLVideoProcessor",
        "patch": 16,
        "clip_norm": False,
    },
    "qwen2-audio": {"processor": "Qwen2AudioProcessor", "audio": True},
}
MODELS: tuple[str, ...] = tuple(SPECS)
AUDIO_MODELS: tuple[str, ...] = tuple(n for n, s in SPECS.items() if s.get("audio"))
VISION_MODELS: tuple[str, ...] = tuple(n for n in MODELS if n not in AUDIO_MODELS)
# Every name `ensure_model` builds: the Qwen models above and the other families.
ALL_MODELS: tuple[str, ...] = MODELS + tuple(FAMILIES)

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
MERGE = 2
TEMPORAL_PATCH = 2


def fingerprint(name: str | None = None) -> str:
    """Hash of everything that decides model ``name``'s bytes: this file (plus a family's
    builder and the builders' shared module) and the building libraries."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    if name in FAMILIES:
        h.update((Path(__file__).parent / "tiny_families" / "common.py").read_bytes())
        for path in module_paths(name):
            h.update(path.read_bytes())
    for dist in ("transformers", "tokenizers", "torch", "safetensors"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}\n".encode())
    return h.hexdigest()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _special_tokens(name: str) -> tuple[str, ...]:
    return AUDIO_SPECIAL_TOKENS if SPECS[name].get("audio") else SPECIAL_TOKENS


def _chat_template(name: str) -> str:
    return AUDIO_CHAT_TEMPLATE if SPECS[name].get("audio") else CHAT_TEMPLATE


def train_tokenizer(specials: tuple[str, ...], vocab_size: int = VOCAB_SIZE) -> Any:
    """The byte-level BPE of every tiny model, trained on the local corpus, with ``specials``
    as its last ``len(specials)`` ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    bpe_size = vocab_size - len(specials)
    trainer = BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size() != bpe_size:
        raise RuntimeError(f"BPE vocabulary has {tok.get_vocab_size()} entries, need {bpe_size}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def added_tokens_decoder(ids: dict[str, int]) -> dict[str, dict[str, Any]]:
    """``tokenizer_config.json``'s entry for special tokens ``ids`` (token -> id)."""
    return {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t, i in ids.items()
    }


def _tokenizer_files(out: Path, name: str) -> dict[str, int]:
    specials = _special_tokens(name)
    tok = train_tokenizer(specials)
    ids = {t: tok.token_to_id(t) for t in specials}
    # tokenizers writes the vocabulary in id order and merges in rank order: stable bytes.
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    _write_json(
        out / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added_tokens_decoder(ids),
            "bos_token": None,
            "chat_template": _chat_template(name),
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>",
            "errors": "replace",
            "extra_special_tokens": {},
            "model_max_length": MAX_POSITIONS,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    )
    return ids


def _audio_processor_files(out: Path, name: str) -> None:
    window_s = 30
    _write_json(
        out / "preprocessor_config.json",
        {
            "chunk_length": window_s,
            "dither": 0.0,
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": MEL_BINS,
            "hop_length": 160,
            "n_fft": 400,
            "n_samples": window_s * AUDIO_SAMPLE_RATE,
            "nb_max_frames": window_s * AUDIO_SAMPLE_RATE // 160,
            "padding_side": "right",
            "padding_value": 0.0,
            "processor_class": SPECS[name]["processor"],
            "return_attention_mask": True,
            "sampling_rate": AUDIO_SAMPLE_RATE,
        },
    )
    (out / "chat_template.jinja").write_text(AUDIO_CHAT_TEMPLATE, encoding="utf-8")


def _processor_files(out: Path, name: str) -> None:
    spec = SPECS[name]
    if spec.get("audio"):
        _audio_processor_files(out, name)
        return
    patch = spec["patch"]
    factor = patch * MERGE
    mean, std = (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD) if spec["clip_norm"] else ([0.5] * 3, [0.5] * 3)
    common = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": mean,
        "image_std": std,
        "merge_size": MERGE,
        "patch_size": patch,
        "processor_class": spec["processor"],
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": TEMPORAL_PATCH,
    }
    image_bounds = {"shortest_edge": (2 * factor) ** 2, "longest_edge": factor * factor * 1280}
    _write_json(
        out / "preprocessor_config.json",
        {
            **common,
            "image_processor_type": "Qwen2VLImageProcessor",
            # Older readers look at min/max_pixels, newer ones at size; both say the same.
            "max_pixels": image_bounds["longest_edge"],
            "min_pixels": image_bounds["shortest_edge"],
            "size": image_bounds,
        },
    )
    video_bounds = {"shortest_edge": factor * factor * 128, "longest_edge": factor * factor * 768}
    video: dict[str, Any] = {
        **common,
        "video_processor_type": spec["video_processor"],
        "max_pixels": video_bounds["longest_edge"],
        "min_pixels": video_bounds["shortest_edge"],
        "size": video_bounds,
        "min_frames": 4,
        "max_frames": 768,
        # Opt in to the qwen-vl-utils total-pixel cap now: it becomes transformers' default in 5.22
        # and leaving it unset logs a warning on every processor.
        "cap_pixels_per_frame": True,
    }
    if name == "qwen3-vl":
        video |= {"do_sample_frames": True, "fps": 2}
    _write_json(out / "video_preprocessor_config.json", video)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


class _SpecialTokenIds(TypedDict):
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int


def _text_config(ids: dict[str, int]) -> dict[str, object]:
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": DTYPE,
    }


def _audio_model_config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Qwen2AudioConfig

    audio: dict[str, object] = {
        "num_mel_bins": MEL_BINS,
        "encoder_layers": 1,
        "encoder_attention_heads": VISION_HEADS,
        "encoder_ffn_dim": 2 * AUDIO_WIDTH,
        "d_model": AUDIO_WIDTH,
        # 30 s of 10 ms mel frames after the stride-2 convolution, as in the real encoder.
        "max_source_positions": 1500,
    }
    text = {**_text_config(ids), "model_type": "qwen2", "max_window_layers": TEXT_LAYERS}
    return Qwen2AudioConfig(
        audio_config=audio, text_config=text, audio_token_index=ids["<|AUDIO|>"], dtype=DTYPE
    )


def _model_config(name: str, ids: dict[str, int]) -> PreTrainedConfig:
    if SPECS[name].get("audio"):
        return _audio_model_config(ids)
    special: _SpecialTokenIds = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    text = _text_config(ids)
    if name in ("qwen2-vl", "qwen2.5-vl"):
        # M-RoPE sections sum to half the head dim (32 / 2).
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [4, 6, 6],
        }
        text["max_window_layers"] = TEXT_LAYERS
    if name == "qwen2-vl":
        from transformers import Qwen2VLConfig

        vision: dict[str, object] = {
            "depth": 1,
            "embed_dim": VISION_WIDTH,
            "hidden_size": HIDDEN,
            "mlp_ratio": 2,
            "num_heads": VISION_HEADS,
            "patch_size": 14,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL_PATCH,
        }
        return Qwen2VLConfig(text_config=text, vision_config=vision, dtype=DTYPE, **special)
    if name == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig

        vision = {
            "depth": 1,
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_heads": VISION_HEADS,
            "out_hidden_size": HIDDEN,
            "patch_size": 14,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL_PATCH,
            "window_size": 112,
            # The real [7, 15, 23, 31] would name missing blocks; keep one full-attention block.
            "fullatt_block_indexes": [0],
        }
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, dtype=DTYPE, **special)
    if name == "qwen3-vl":
        from transformers import Qwen3VLConfig

        text["head_dim"] = HEAD_DIM
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": [6, 5, 5],
            "mrope_interleaved": True,
        }
        vision = {
            "depth": 1,
            "hidden_size": VISION_WIDTH,
            "intermediate_size": 2 * VISION_WIDTH,
            "num_heads": VISION_HEADS,
            "out_hidden_size": HIDDEN,
            "patch_size": 16,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL_PATCH,
            # A 16x16 learned grid, interpolated to the image's grid like the real 48x48 one.
            "num_position_embeddings": 256,
            # Deepstack taps must name existing vision blocks.
            "deepstack_visual_indexes": [0],
        }
        return Qwen3VLConfig(text_config=text, vision_config=vision, dtype=DTYPE, **special)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def build_model(name: str, out_dir: Path) -> None:
    """Write model `name` (weights, config, tokenizer, processor files) into `out_dir`."""
    if name in FAMILIES:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        builder(name)(Path(out_dir))
        return
    if name not in SPECS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(ALL_MODELS)}")
    import torch
    from transformers import AutoModelForImageTextToText, AutoModelForMultimodalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer_files(out_dir, name)
    _processor_files(out_dir, name)
    config = _model_config(name, ids)
    # The image-text auto class has no audio models; the vision ones stay on it (same bytes).
    auto = AutoModelForMultimodalLM if SPECS[name].get("audio") else AutoModelForImageTextToText
    # A private RNG stream: same weights every build, caller's torch RNG left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        # transformers' factory and GenerationConfig have unannotated signatures.
        model = auto.from_config(  # type: ignore[no-untyped-call]
            config, dtype=getattr(torch, DTYPE)
        )
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    # The shard-writing progress bar is noise in test logs and CLI output.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
    try:
        model.save_pretrained(out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
    if SPECS[name].get("audio"):
        _hub_layout_audio_weights(out_dir / "model.safetensors")


def _hub_layout_audio_weights(path: Path) -> None:
    """Rename the text model's weights to the published Qwen2-Audio layout
    (``language_model.model.layers...``), which vLLM loads; transformers 5 writes one
    ``model.`` too many there."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    bad = "language_model.model.model."
    renamed = {
        ("language_model.model." + k[len(bad) :] if k.startswith(bad) else k): v
        for k, v in tensors.items()
    }
    save_file(renamed, path, metadata={"format": "pt"})


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else ROOT / ".cache" / "models"


def _is_current(path: Path, digest: str) -> bool:
    try:
        return (path / MARKER).read_text().strip() == digest
    except OSError:
        return False


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_model(name: str = "qwen2-vl", root: Path | None = None, *, force: bool = False) -> Path:
    """Return the folder of model `name` under `root`, building it first if missing or stale."""
    if name not in ALL_MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(ALL_MODELS)}")
    root = Path(root) if root is not None else cache_root()
    target = root / name
    digest = fingerprint(name)
    if not force and _is_current(target, digest):
        return target
    root.mkdir(parents=True, exist_ok=True)
    # The lock serialises builders; readers never take it because the folder appears by rename.
    with _locked(root / f".{name}.lock"):
        if not force and _is_current(target, digest):
            return target
        # Leftovers of a builder that was killed; no other builder of this name runs now.
        for pattern in (f".{name}.build-*", f".{name}.stale-*"):
            for leftover in root.glob(pattern):
                shutil.rmtree(leftover, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
        try:
            build_model(name, tmp)
            (tmp / MARKER).write_text(digest + "\n")
            # mkdtemp and safetensors create owner-only entries; the cache is shared.
            for path in tmp.iterdir():
                path.chmod(0o644)
            tmp.chmod(0o755)
            if target.exists():
                stale = Path(tempfile.mkdtemp(prefix=f".{name}.stale-", dir=root))
                target.rename(stale / name)
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"any of {list(ALL_MODELS)} (default: all)")
    parser.add_argument(
        "--out", type=Path, help=f"cache root (default ${CACHE_ENV} or .cache/models)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    names = args.names or list(ALL_MODELS)
    for name in names:
        if name not in ALL_MODELS:
            parser.error(f"unknown model {name!r}; choose from {', '.join(ALL_MODELS)}")
    for name in names:
        print(ensure_model(name, args.out, force=args.force), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
