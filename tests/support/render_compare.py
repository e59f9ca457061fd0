"""Render answers compared as upstream's: our render JSON equals `vllm launch render`'s field for
field; where we differ on purpose (is_embed, max_tokens always written, random ids, items named
by their content) the exact difference is asserted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from tandem_wire import b64decode_item_bytes, content_id, decode_item_b64

from .items import assert_nested_equal


def post(url: str, path: str, body: dict) -> bytes:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text[:2000]
    return r.content


def post_json(url: str, path: str, body: dict) -> Any:
    return json.loads(post(url, path, body))


def assert_items_equal(ours: str | None, theirs: str | None) -> None:
    """Two base64 kwargs items hold the same tensors and layouts."""
    assert (ours is None) == (theirs is None)
    if ours is None or theirs is None:
        return
    a, b = decode_item_b64(ours), decode_item_b64(theirs)
    assert sorted(a) == sorted(b)  # key order is not meaningful (vLLM's own cache changes it)
    for key in a:
        assert a[key].layout == b[key].layout, key
        assert_nested_equal(a[key].data, b[key].data)


RANDOM_ID_PART = re.compile(r"-[0-9a-f]{16}(?=-\d+$|$)")


def assert_same_request(ours: dict, theirs: dict, model: str) -> None:
    """Every field of our render answer (JSON, as sent) equals upstream's, except where we
    differ on purpose; there the difference is asserted exactly."""
    assert sorted(ours) == sorted(theirs)
    for key, upstream in theirs.items():
        mine = ours[key]
        if key == "request_id":
            # Random unless the caller chose it: same shape (prefix, 16 hex, prompt index).
            assert RANDOM_ID_PART.sub("-R", mine) == RANDOM_ID_PART.sub("-R", upstream)
        elif key == "sampling_params":
            assert_same_sampling(mine, upstream)
        elif key == "features" and upstream is not None:
            assert_same_features(mine, upstream, ours["token_ids"], model, ours.get("cache_salt"))
        else:
            assert mine == upstream, key


def assert_same_sampling(ours: dict, theirs: dict) -> None:
    # Upstream's fields are all ours. Upstream leaves max_tokens out when it equals
    # SamplingParams' default; ours writes it, so generate never reads "no limit" there.
    from vllm.sampling_params import SamplingParams

    assert {k: v for k, v in ours.items() if k in theirs} == theirs
    assert set(ours) - set(theirs) <= {"max_tokens"}
    assert ours["max_tokens"] == theirs.get("max_tokens", SamplingParams().max_tokens)


def assert_same_features(
    ours: dict, theirs: dict, token_ids: list[int], model: str, salt: str | None
) -> None:
    assert sorted(ours) == sorted(theirs)
    # On purpose: each item we send is named by its content id (the name generate keys it
    # by; tandem_wire.content_ids), upstream's by vLLM's hash of the media.
    assert {m: len(h) for m, h in ours["mm_hashes"].items()} == {
        m: len(h) for m, h in theirs["mm_hashes"].items()
    }
    data = ours["kwargs_data"] or {}
    for modality, names in ours["mm_hashes"].items():
        items = data.get(modality) or [None] * len(names)
        for name, item, upstream_name in zip(
            names, items, theirs["mm_hashes"][modality], strict=True
        ):
            expected = (
                upstream_name
                if item is None
                else content_id(salt or "", b64decode_item_bytes(item))
            )
            assert name == expected
    assert sorted(ours["mm_placeholders"]) == sorted(theirs["mm_placeholders"])
    for modality, ranges in theirs["mm_placeholders"].items():
        embedded = embedding_token(model, modality)
        for mine, upstream in zip(ours["mm_placeholders"][modality], ranges, strict=True):
            # Upstream drops is_embed; ours carries it wherever a run holds tokens that take no
            # embedding (Qwen3-VL video timestamps), and leaves it out when all of them do.
            assert sorted(upstream) == ["length", "offset"]
            run = token_ids[upstream["offset"] : upstream["offset"] + upstream["length"]]
            mask = [t == embedded for t in run]
            assert mine == (upstream if all(mask) else {**upstream, "is_embed": mask})
    for name in ("kwargs_data", "mm_metadata"):
        mine, upstream = ours[name], theirs[name]
        assert (mine is None) == (upstream is None), name
        assert sorted(mine or {}) == sorted(upstream or {}), name
        for modality in upstream or {}:
            for a, b in zip(mine[modality], upstream[modality], strict=True):
                assert_items_equal(a, b)


def embedding_token(model: str, modality: str) -> int | None:
    """The token a model's ``modality`` embeddings replace (vLLM's ``_get_prompt_updates``):
    by either name configs use, except where the family embeds another token."""
    config = json.loads((Path(model) / "config.json").read_text())
    # Qwen2.5-Omni names its tokens in the thinker's config (the model vLLM serves).
    config = config.get("thinker_config") or config
    if modality == "video" and config.get("model_type") in ("glm4v", "glm4v_moe", "glm_ocr"):
        # GLM-4.1V's, GLM-4.5V's and GLM-OCR's video frames are runs of image tokens.
        return int(config["image_token_id"])
    if modality == "video" and config.get("model_type") == "internvl":
        # InternVL's config names no video token: its processor's ``video_token`` is
        # the tokenizer's (``<video>``), each frame a run of it between ``<img>`` and ``</img>``.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        return int(tokenizer.get_vocab()[tokenizer.video_token])
    if modality == "image" and config.get("model_type") == "llama4":
        # Llama 4 embeds its tiles' <|patch|> tokens; <|image|> (image_token_index) only
        # separates the global view from the tiles and takes no embedding.
        from transformers import AutoTokenizer

        return int(AutoTokenizer.from_pretrained(model).convert_tokens_to_ids("<|patch|>"))
    for scope in (config, config.get("text_config") or {}):
        for key in (f"{modality}_token_id", f"{modality}_token_index"):
            if scope.get(key) is not None:
                return int(scope[key])
    return None
