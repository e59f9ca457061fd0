"""The front door as a process over real render and generate processes: the OpenAI SDK and
TRL's VLLMClient (both as released) against it, answers equal to ``vllm serve``'s, affinity."""

from __future__ import annotations

import asyncio
import io
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tandem_client import AsyncTandemClient
from tandem_client.routing import rendezvous_order
from tandem_front.settings import FrontSettings

from ..support import openai_compare
from ..support.images import data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]


def openai_client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)


def image_chat(seeds: list[int], text: str = "Describe.") -> list[dict]:
    parts: list[dict] = [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=s))}} for s in seeds
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def both(fleet, front_door, **request):
    """The same chat request through the front door and through upstream `vllm serve`."""
    model, urls = fleet
    ours = openai_client(front_door[0]).chat.completions.create(model=model, **request)
    theirs = openai_client(urls["up_serve"]).chat.completions.create(model=model, **request)
    return ours, theirs


def extra(obj, name: str):
    return (obj.model_extra or {}).get(name)


def test_health_models_metrics(fleet, front_door):
    model, _ = fleet
    url = front_door[0]
    assert httpx.get(f"{url}/health", timeout=60).json() == {
        "status": "ok",
        "render": 1,
        "generate": 2,
    }
    models = openai_client(url).models.list()
    assert [m.id for m in models.data] == [model]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions/render", json=body, timeout=60).status_code == 200
    # Both workers' values, from their files (a labelled metric shows once it has a value).
    metrics = httpx.get(f"{url}/metrics").text
    assert "tandem_front_upstream_latency_seconds_count{" in metrics and 'tier="render"' in metrics


def test_openai_chat_with_two_images_equals_vllm_serve(fleet, front_door):
    ours, theirs = both(
        fleet,
        front_door,
        messages=image_chat([41, 42]),
        temperature=0.0,
        max_tokens=12,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    (a,), (b,) = ours.choices, theirs.choices
    assert a.message.content == b.message.content and a.message.content
    assert extra(a, "token_ids") == extra(b, "token_ids")
    assert extra(ours, "prompt_token_ids") == extra(theirs, "prompt_token_ids")
    assert (a.finish_reason, ours.usage) == (b.finish_reason, theirs.usage)
    for x, y in zip(a.logprobs.content, b.logprobs.content, strict=True):
        assert x.token == y.token and x.bytes == y.bytes
        assert x.logprob == pytest.approx(y.logprob, abs=1e-3)
        assert [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]


def test_stop_strings_cut_where_vllm_serve_cuts(fleet, front_door):
    request = {"messages": image_chat([43]), "temperature": 0.0, "max_tokens": 16}
    full, _ = both(fleet, front_door, **request)
    text = full.choices[0].message.content
    stop = text[5:7]  # two characters from the middle of the greedy text
    for include in (False, True):
        ours, theirs = both(
            fleet,
            front_door,
            **request,
            stop=[stop],
            extra_body={"include_stop_str_in_output": include, "return_token_ids": True},
        )
        (a,), (b,) = ours.choices, theirs.choices
        assert a.message.content == b.message.content
        assert (a.finish_reason, extra(a, "stop_reason")) == ("stop", stop)
        assert (b.finish_reason, extra(b, "stop_reason")) == ("stop", stop)
        assert extra(a, "token_ids") == extra(b, "token_ids")


def test_streamed_chat_with_usage_equals_vllm_serve(fleet, front_door):
    model, urls = fleet
    request = {
        "model": model,
        "messages": image_chat([44, 45]),
        "temperature": 0.0,
        "max_tokens": 12,
        "stream_options": {"include_usage": True},
    }
    # Merged per choice and compared by the chunk sequence's shape (role, deltas, finish,
    # usage): how many tokens one chunk carries follows the machine's load on either side.
    ours, _ = openai_compare.answers(front_door[0], urls["up_serve"], True, True, **request)
    first, usage = ours[0], ours[-2]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert openai_compare.merged(ours, True)["choices"][0]["text"]
    assert ours[-1] == openai_compare.DONE and not usage["choices"] and usage["usage"]


def test_n_2_with_logprobs_equals_vllm_serve(fleet, front_door):
    # top_k=1 makes both samples greedy (vLLM refuses n > 1 at temperature 0); a seed picks
    # the same among the tiny model's exact ties, and both caches hold the prompt first.
    model, urls = fleet
    openai_compare.warm(
        front_door[0], urls["up_serve"], True, model=model, messages=image_chat([46])
    )
    ours, theirs = both(
        fleet,
        front_door,
        messages=image_chat([46]),
        seed=0,
        n=2,
        temperature=1.0,
        max_tokens=8,
        logprobs=True,
        extra_body={"top_k": 1, "return_token_ids": True},
    )
    assert len(ours.choices) == 2
    assert [c.message.content for c in ours.choices] == [c.message.content for c in theirs.choices]
    assert [extra(c, "token_ids") for c in ours.choices] == [
        extra(c, "token_ids") for c in theirs.choices
    ]
    assert ours.usage == theirs.usage


def test_completions_with_token_ids_equal_vllm_serve(fleet, front_door):
    model, urls = fleet
    request = {
        "model": model,
        "prompt": ["The quick brown", "Once upon"],
        "temperature": 0.0,
        "max_tokens": 8,
        "logprobs": 0,
        "extra_body": {"return_token_ids": True, "return_tokens_as_token_ids": True},
    }
    ours = openai_client(front_door[0]).completions.create(**request)
    theirs = openai_client(urls["up_serve"]).completions.create(**request)
    assert [c.text for c in ours.choices] == [c.text for c in theirs.choices]
    for a, b in zip(ours.choices, theirs.choices, strict=True):
        assert extra(a, "token_ids") == extra(b, "token_ids")
        assert extra(a, "prompt_token_ids") == extra(b, "prompt_token_ids")
        assert a.logprobs.tokens == b.logprobs.tokens
    assert ours.usage == theirs.usage


MAX_MODEL_LEN = 4096  # tools/servers.py starts every engine with this context


def test_max_tokens_past_the_room_left_is_clamped_as_vllm_serve_clamps_it(fleet, front_door):
    """Render clamps max_tokens to the room left, as vllm serve does; before, the door wrote
    the caller's value back and generate refused it (400 where vllm serve answers 200)."""
    model, urls = fleet
    room = 6
    request = {
        "model": model,
        "prompt": [100] * (MAX_MODEL_LEN - room),
        "temperature": 0.0,
        "max_tokens": MAX_MODEL_LEN,
        "extra_body": {"return_token_ids": True},
    }
    ours = openai_client(front_door[0]).completions.create(**request)
    theirs = openai_client(urls["up_serve"]).completions.create(**request)
    (a,), (b,) = ours.choices, theirs.choices
    assert (a.text, extra(a, "token_ids")) == (b.text, extra(b, "token_ids"))
    assert a.finish_reason == b.finish_reason
    assert ours.usage == theirs.usage and theirs.usage.completion_tokens <= room

    # The same for chat: a text long enough to leave a few tokens of room (measured on vllm
    # serve: tokens per repetition and the template's own).
    def prompt_tokens(k: int) -> int:
        asked = openai_client(urls["up_serve"]).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi " * k}], max_tokens=1
        )
        return asked.usage.prompt_tokens

    base, per = prompt_tokens(0), (prompt_tokens(1000) - prompt_tokens(0)) / 1000
    k = int((MAX_MODEL_LEN - 8 - base) / per)
    ours, theirs = both(
        fleet,
        front_door,
        messages=[{"role": "user", "content": "hi " * k}],
        temperature=0.0,
        max_completion_tokens=MAX_MODEL_LEN,
        extra_body={"return_token_ids": True},
    )
    (a,), (b,) = ours.choices, theirs.choices
    assert a.message.content == b.message.content
    assert extra(a, "token_ids") == extra(b, "token_ids")
    assert (a.finish_reason, ours.usage) == (b.finish_reason, theirs.usage)
    assert ours.usage.prompt_tokens + ours.usage.completion_tokens <= MAX_MODEL_LEN


def test_errors_of_the_tiers_pass_through(fleet, front_door):
    model, _ = fleet
    r = httpx.post(
        f"{front_door[0]}/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 404 and r.json()["error"]["type"] == "model_not_found"
    r = httpx.post(f"{front_door[0]}/inference/v1/generate", json={"token_ids": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request"


# -- TRL's VLLMClient, as released -------------------------------------------------------------


def pil(seed: int) -> Image.Image:
    return Image.open(io.BytesIO(png_bytes(seed=seed)))


def test_trl_client_unmodified(fleet, front_door):
    from transformers import AutoProcessor
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    model, urls = fleet
    processor = AutoProcessor.from_pretrained(model)
    images = [[pil(51), pil(52)], [pil(53), pil(54)]]
    questions = ["What is it?", "Which is larger?"]
    # top_k=1: greedy samples (vLLM refuses n > 1 at temperature 0). The tiny model's logits
    # are nearly flat, so exact ties happen (top_k keeps every tied token and samples among
    # them: a seed makes that pick the same both ways), and a sample whose prefill came from
    # the prefix cache (as n > 1 siblings may, by scheduling) can pick another token.
    sampling = {"n": 4, "temperature": 1.0, "top_k": 1, "max_tokens": 8, "logprobs": 0}
    fixed = {"skip_reading_prefix_cache": True, "seed": 0}

    # tandem_client, straight to the pair: prompts with one image token per image, expanded
    # by render, generated on the node the door would pick.
    def template(question: str) -> list[int]:
        content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": question}]
        text = processor.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        return processor.tokenizer.encode(text, add_special_tokens=False)

    async def through_tandem_client(question: str, imgs: list) -> tuple[list[int], list, list]:
        async with AsyncTandemClient(urls["render"], front_door[1], model=model) as tc:
            (req,) = await tc.render_completion([template(question)], images=[imgs])
            answer = await tc.generate(req, **sampling, **fixed)
        choices = sorted(answer.choices, key=lambda c: c.index)
        logprobs = [[[t.logprob] for t in c.logprobs.content] for c in choices]
        return req.token_ids, [c.token_ids for c in choices], logprobs

    client = VLLMClient(base_url=front_door[0])
    assert client.model == model
    trainer = SimpleNamespace(processing_class=processor)
    features = client.image_features(images)
    for question, imgs, feats in zip(questions, images, features, strict=True):
        prompt, completions, logprobs = asyncio.run(through_tandem_client(question, imgs))
        # TRL's way: the prompt as its trainer holds it (expanded), the images' features from
        # the server, re-pointed by TRL's own code, generated through the front door.
        placed = VLLMGeneration._place_features(trainer, feats, prompt)
        out = client.generate(
            prompts=[prompt], features=[placed], **sampling, generation_kwargs=fixed
        )
        assert out["prompt_ids"] == [prompt]
        assert out["completion_ids"] == completions and len(completions) == 4
        assert out["logprob_token_ids"] == [[[t] for t in c] for c in completions]
        for ours, theirs in zip(out["logprobs"], logprobs, strict=True):
            assert np.allclose(ours, theirs, atol=1e-3)
    client.reset_prefix_cache()

    chat = client.chat(
        [[{"role": "user", "content": "hi"}]], n=2, temperature=1.0, top_k=1, max_tokens=5
    )
    assert len(chat["completion_ids"]) == 2 and chat["prompt_ids"][0]
    text_only = client.generate(prompts=["hello"], n=1, temperature=0.0, max_tokens=4)
    assert len(text_only["completion_ids"][0]) == 4
    client.reset_prefix_cache()


def test_reset_prefix_cache_reaches_every_generate_node(front_door):
    r = httpx.post(f"{front_door[0]}/reset_prefix_cache", timeout=60)
    assert r.status_code == 200
    assert {n["url"] for n in r.json()["nodes"]} == set(front_door[1])
    assert all(n["body"] == {"success": True} for n in r.json()["nodes"])


def test_one_weight_update_through_the_door_reaches_both_generate_nodes(
    fleet, front_door, weight_dir
):
    # tandem_client pointed at the door alone: start/update/finish fan out to both nodes,
    # and both then answer with the new weights' tokens.
    import torch
    from safetensors.torch import load_file

    model, _ = fleet
    door, nodes = front_door
    original = load_file(f"{model}/model.safetensors")
    head = original["lm_head.weight"]
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(head.shape, generator=gen) * (head.float().std() + 0.01) * 4
    new_head = (head.float() + noise).to(head.dtype)
    prompt = [1017, 359, 261, 198, 82, 88, 1018, 198, 1017, 436, 198]
    body = {"token_ids": prompt, "sampling_params": {"temperature": 0.0, "max_tokens": 8}}

    def tokens_on(url: str) -> tuple[list[int], str]:
        r = httpx.post(f"{url}/inference/v1/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["token_ids"], choice["weight_versions"][0]["version"]

    async def update(weights: dict, version: str) -> None:
        async with AsyncTandemClient(door, door, model=model, weight_dir=weight_dir) as c:
            await c.update_weights(weights, version=version)

    before = [tokens_on(u) for u in nodes]
    try:
        asyncio.run(update({"lm_head.weight": new_head}, "door-1"))
        after = [tokens_on(u) for u in nodes]
        assert after[0] == after[1] and after[0][1] == "door-1"
        assert after[0][0] != before[0][0]
        versions = [httpx.get(f"{u}/weight_info").json()["weight_version"] for u in nodes]
        assert versions == ["door-1", "door-1"]
    finally:
        asyncio.run(update({"lm_head.weight": head}, "default"))
    assert [tokens_on(u) for u in nodes] == before


# -- affinity ----------------------------------------------------------------------------------


def node_counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


def test_repeated_images_land_on_the_node_that_holds_them(fleet, front_door):
    model, _ = fleet
    url, generate_urls = front_door
    # Each door worker re-reads the nodes' versions every --fence-poll-s; one whose last read
    # fell inside an earlier test's update holds the slower node fenced (no work) until its
    # next read. Once the nodes agree, two poll periods and a margin settle every worker: a
    # read that began before they agreed lands within one, the next read within the second.
    deadline = time.monotonic() + 60
    while len({httpx.get(f"{u}/weight_info").json()["weight_version"] for u in generate_urls}) > 1:
        assert time.monotonic() < deadline, "the generate nodes never agreed on a version"
        time.sleep(0.2)
    time.sleep(2 * FrontSettings.fence_poll_s + 1.0)

    async def run() -> tuple[str, dict, dict]:
        # tandem_client pointed at the door for both tiers: it sends an item's data once,
        # then only its hash; the door must route the repeat where the data went.
        async with AsyncTandemClient(url, url, model=model) as tc:
            req = await tc.render_chat(image_chat([61]), max_tokens=2)
            node = rendezvous_order(req.features.mm_hashes["image"][0], generate_urls)[0]
            before = {
                u: node_counter(u, "tandem_generate_item_cache_hits_total") for u in generate_urls
            }
            misses = node_counter(node, "tandem_generate_item_cache_misses_total")
            await tc.generate(req)
            await tc.generate(req)
            await tc.generate(req)
            after = {
                u: node_counter(u, "tandem_generate_item_cache_hits_total") for u in generate_urls
            }
            assert node_counter(node, "tandem_generate_item_cache_misses_total") == misses
            return node, before, after

    node, before, after = asyncio.run(run())
    assert after[node] - before[node] == 2  # the two repeats: hash only, found there
    other = next(u for u in generate_urls if u != node)
    assert after[other] == before[other]


# -- the door as a proxy -----------------------------------------------------------------------


def test_a_caller_hanging_up_on_a_non_streamed_chat_aborts_the_engine_request(fleet, front_door):
    # A non-streamed answer is sent whole at its end, so until then only the door can notice
    # that its caller left: the generate node's own engine must then stop the request.
    model, _ = fleet
    url, generate_urls = front_door
    probe_tokens = 8

    def nodes(name: str) -> list[float]:
        return [node_counter(u, name) for u in generate_urls]

    async def until(condition, timeout_s: float) -> bool:
        for _ in range(int(timeout_s / 0.2)):
            if await asyncio.to_thread(condition):
                return True
            await asyncio.sleep(0.2)
        return False

    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": 3900,
        "ignore_eos": True,
        "temperature": 0.0,
    }

    async def hang_up() -> tuple[bool, bool]:
        async with httpx.AsyncClient(timeout=120) as client:
            call = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=body))
            # Admitted by a generate node, whose engine holds it queued: it cannot finish.
            held = await until(lambda: sum(nodes("tandem_generate_pending")) == 1, 60)
            call.cancel()  # the caller hangs up: httpx closes its connection to the door
            await asyncio.gather(call, return_exceptions=True)
        # The door let go of the node, and the node of the engine request.
        return held, await until(lambda: sum(nodes("tandem_generate_pending")) == 0, 60)

    assert wait_idle(lambda: sum(nodes("vllm:num_requests_running")))  # earlier tests' requests
    # vLLM's keep pause holds a new request in the engine's queue, unscheduled, for as long as
    # the test needs: the hang-up meets it there, however slowly a busy machine answers.
    keep = {"mode": "keep", "clear_cache": "false"}
    assert httpx.post(f"{url}/pause", params=keep, timeout=60).status_code == 200
    try:
        held, let_go = asyncio.run(hang_up())
    finally:
        assert httpx.post(f"{url}/resume", timeout=60).status_code == 200
    assert held, "the chat never reached a generate node"
    assert let_go, "a generate node still holds the request its caller hung up on"
    # Each engine, resumed, runs only a short probe: an engine still holding the aborted
    # request would schedule it in the probe's steps (it is first in the queue).
    before = nodes("vllm:generation_tokens_total")
    probe = {
        "token_ids": [1017, 82, 88],
        "sampling_params": {"max_tokens": probe_tokens, "ignore_eos": True},
    }
    for node in generate_urls:
        r = httpx.post(f"{node}/inference/v1/generate", json=probe, timeout=120)
        assert r.status_code == 200, r.text
    produced = [a - b for a, b in zip(nodes("vllm:generation_tokens_total"), before, strict=True)]
    assert produced == [probe_tokens] * len(generate_urls)


def wait_idle(running) -> bool:
    deadline = time.monotonic() + 30
    while running() != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
