"""Request screening: media parts pulled out, unsupported parts and kwargs refused."""

from __future__ import annotations

import pytest

from tandem_http import BadRequest, PromptTooLong, TokenOutOfVocabulary, VllmBadRequest
from tandem_render.prepare import (
    ItemLimit,
    ProcessorFacts,
    RequestLimits,
    prepare_chat,
    prepare_completion,
)

LIMITS = RequestLimits(
    item_limits={"image": ItemLimit(2), "video": ItemLimit(999, 1)},
    mm_kwargs_allowlist=frozenset({"min_pixels", "max_pixels"}),
    max_kwargs_pixels=1_000_000,
)


def chat(*parts, **extra):
    return {"messages": [{"role": "user", "content": list(parts)}], **extra}


def test_media_urls_are_replaced_by_tokens():
    body = chat(
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_bytes", "image_bytes": b"\x89PNG"},
    )
    prepared = prepare_chat(body, LIMITS)
    parts = prepared.body["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "hi"}
    assert parts[1]["image_url"]["url"] == prepared.media[0].token
    assert parts[2] == {"type": "image_url", "image_url": {"url": prepared.media[1].token}}
    assert prepared.media[0].url == "https://example.com/a.png"
    assert prepared.media[1].data == b"\x89PNG"
    assert body["messages"][0]["content"][1]["image_url"]["url"].startswith("https")  # untouched


def test_string_content_and_string_image_url():
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "image_url", "image_url": "data:x"}]},
        ]
    }
    prepared = prepare_chat(body, LIMITS)
    assert prepared.body["messages"][0]["content"] == "be brief"
    assert prepared.media[0].url == "data:x"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_pil", "image_pil": None},
        {"type": "input_audio", "input_audio": {}},
        {"type": "image_url", "image_url": {"url": "data:x"}, "uuid": "mine"},
        {"type": "image_url", "image_url": {}},
        {"type": "image_bytes", "image_bytes": "not bytes"},
        "plain string part is fine",
    ],
)
def test_unsupported_parts(part):
    if isinstance(part, str):
        prepare_chat(chat(part), LIMITS)
        return
    with pytest.raises(BadRequest):
        prepare_chat(chat(part), LIMITS)


def test_image_and_video_limits():
    img = {"type": "image_url", "image_url": {"url": "data:x"}}
    vid = {"type": "video_url", "video_url": {"url": "data:v"}}
    aud = {"type": "audio_url", "audio_url": {"url": "data:a"}}
    prepare_chat(chat(img, img, vid), LIMITS)
    # vLLM's words, type and param (``validate_num_items``): past an operator's limit the
    # message says how to raise it, past the model's own it does not; a modality the model
    # does not take has a limit of 0.
    for parts, message in (
        ((img, img, img), "At most 2 image(s) may be provided in one prompt. Set `--limit-mm"),
        ((vid, vid), "At most 1 video(s) may be provided in one prompt."),
        ((aud,), "At most 0 audio(s) may be provided in one prompt."),
    ):
        with pytest.raises(VllmBadRequest) as refused:
            prepare_chat(chat(*parts), LIMITS)
        assert refused.value.message.startswith(message)
        assert refused.value.message.endswith("increase this limit.") == ("Set" in message)
        assert refused.value.param == parts[0]["type"].removesuffix("_url")
        assert refused.value.type == "BadRequestError"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"do_resize": False},
        {"max_pixels": -1},
        {"max_pixels": 10**12},
        {"min_pixels": "many"},
        {"min_pixels": True},
        "not a dict",
    ],
)
def test_mm_processor_kwargs_screened(kwargs):
    with pytest.raises(BadRequest):
        prepare_chat(chat({"type": "text", "text": "x"}, mm_processor_kwargs=kwargs), LIMITS)


def test_allowed_mm_processor_kwargs_pass():
    prepare_chat(
        chat({"type": "text", "text": "x"}, mm_processor_kwargs={"max_pixels": 50176}), LIMITS
    )


def test_kwargs_bounded_by_the_model_and_the_context():
    facts = ProcessorFacts(
        max_pixels=1_003_520,
        pixels_per_token=784,
        max_frames=768,
        item_limits={"image": ItemLimit(8), "video": ItemLimit(1)},
    )
    limits = RequestLimits.build(
        allowlist=frozenset({"min_pixels", "max_pixels", "num_frames", "fps"}),
        facts=facts,
        max_model_len=4096,
        max_image_pixels=64 * 2**20,
    )
    assert limits.max_kwargs_pixels == 1_003_520 and limits.max_kwargs_frames == 768
    img = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    for bad in ({"min_pixels": 1_003_521}, {"num_frames": 769}, {"fps": 10_000}):
        with pytest.raises(BadRequest):
            prepare_chat(chat(img, mm_processor_kwargs=bad), limits)
    # 5 images x at least 1024 tokens each > 4096; 4 of them fit.
    with pytest.raises(PromptTooLong):
        prepare_chat(chat(*[img] * 5, mm_processor_kwargs={"min_pixels": 784 * 1024}), limits)
    prepare_chat(chat(*[img] * 4, mm_processor_kwargs={"min_pixels": 784 * 1024}), limits)
    # An operator bound below the model's wins; one above it does not raise the model's.
    low = RequestLimits.build(
        allowlist=frozenset(),
        facts=facts,
        max_model_len=4096,
        max_kwargs_pixels=50_000,
        max_image_pixels=64 * 2**20,
    )
    assert low.max_kwargs_pixels == 50_000


def test_media_io_kwargs_refused():
    with pytest.raises(BadRequest):
        prepare_chat(chat({"type": "text", "text": "x"}, media_io_kwargs={"image": {}}), LIMITS)


@pytest.mark.parametrize("body", [[], "x", {"messages": []}, {"messages": [3]}])
def test_malformed_chat(body):
    with pytest.raises(BadRequest):
        prepare_chat(body, LIMITS)


def test_completion_token_ids_checked_against_vocabulary():
    prepare_completion({"prompt": [1, 2, 3]}, LIMITS, vocab_size=10)
    for bad in ([1, 10], [-1], [[1], [2, 99]]):
        with pytest.raises(TokenOutOfVocabulary):
            prepare_completion({"prompt": bad}, LIMITS, vocab_size=10)


def test_completion_images_per_prompt():
    prepared = prepare_completion(
        {"prompt": [[1, 2], [3]], "images": [["data:a", b"raw"], None]}, LIMITS, vocab_size=10
    )
    assert "images" not in prepared.body
    assert [r.url or r.data for r in prepared.media[0]] == ["data:a", b"raw"]
    assert prepared.media[1] is None


def test_completion_videos_and_audios_per_prompt_keep_each_modalitys_order():
    body = {
        "prompt": [[1, 2], [3], [4]],
        "images": [["data:i"], None, None],
        "videos": [["data:v"], None, [b"v2"]],
        "audios": [[b"a1", {"url": "data:a2"}], None, None],
    }
    limits = RequestLimits(
        item_limits={"image": ItemLimit(1), "video": ItemLimit(1), "audio": ItemLimit(2)},
        mm_kwargs_allowlist=frozenset(),
        max_kwargs_pixels=1,
    )
    prepared = prepare_completion(body, limits, vocab_size=10)
    assert not {"images", "videos", "audios"} & set(prepared.body)
    first, second, third = prepared.media
    assert [(r.modality, r.url or r.data) for r in first] == [
        ("image", "data:i"),
        ("video", "data:v"),
        ("audio", b"a1"),
        ("audio", "data:a2"),
    ]
    assert second is None
    assert [(r.modality, r.data) for r in third] == [("video", b"v2")]
    tokens = [r.token for refs in (first, third) for r in refs]
    assert len(set(tokens)) == len(tokens)  # each item names its own bytes


@pytest.mark.parametrize("field", ["videos", "audios"])
@pytest.mark.parametrize(
    ("value", "param"),
    [
        (["data:a"], "{f}"),  # not one entry per prompt
        ([["data:a"], None, None], "{f}"),
        ("x", "{f}"),
        ([3, None], "{f}"),
        ([[3], None], "{f}[0][0]"),
        ([[{"uuid": "x"}], None], "{f}[0][0]"),
        ([[""], None], "{f}[0][0]"),
    ],
)
def test_completion_videos_and_audios_must_parallel_prompts(field, value, param):
    with pytest.raises(BadRequest) as caught:
        prepare_completion({"prompt": [[1], [2]], field: value}, LIMITS, vocab_size=10)
    assert caught.value.param == param.format(f=field)


def test_completion_too_many_videos_or_audios_in_one_prompt():
    limits = RequestLimits(
        item_limits={"image": ItemLimit(2), "video": ItemLimit(1), "audio": ItemLimit(2)},
        mm_kwargs_allowlist=frozenset(),
        max_kwargs_pixels=1,
    )
    prepare_completion({"prompt": [[1], [2]], "videos": [["a"], ["b"]]}, limits, vocab_size=10)
    for field, items, words in (
        ("videos", ["a", "b"], "At most 1 video"),
        ("audios", [b"a"] * 3, "At most 2 audio"),
    ):
        with pytest.raises(VllmBadRequest, match=words):
            prepare_completion({"prompt": [1], field: [items]}, limits, vocab_size=10)


@pytest.mark.parametrize(
    "images",
    [["data:a"], [["data:a"], None, None], [3, None], "x"],
)
def test_completion_images_must_parallel_prompts(images):
    with pytest.raises(BadRequest):
        prepare_completion({"prompt": [[1], [2]], "images": images}, LIMITS, vocab_size=10)


def test_completion_too_many_images_in_one_prompt():
    with pytest.raises(VllmBadRequest):
        prepare_completion({"prompt": [1], "images": [["a", "b", "c"]]}, LIMITS, vocab_size=10)


@pytest.mark.parametrize("prompt", [None, [], {}, [[]], [1.5], [1, True]])
def test_completion_bad_prompts(prompt):
    with pytest.raises(BadRequest):
        prepare_completion({"prompt": prompt}, LIMITS, vocab_size=10)
