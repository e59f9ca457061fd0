"""Generate as processes: tokens equal vLLM's own chat path, interop with upstream both ways,
and an engine request aborted when its client disconnects."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tandem_wire import WireFormat, decode_generate_request, encode_generate_request

from ..support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]

GREEDY = {"temperature": 0.0, "max_tokens": 10}


def post_json(url: str, body: dict | bytes, **kwargs) -> dict:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    r = httpx.post(url, content=content, headers=headers, timeout=120, **kwargs)
    assert r.status_code == 200, r.text[:1500]
    return r.json()


def rendered(urls: dict, which: str, body: dict) -> bytes:
    r = httpx.post(f"{urls[which]}/v1/chat/completions/render", json=body, timeout=120)
    assert r.status_code == 200, r.text[:1500]
    return r.content


def monolithic_tokens(urls: dict, body: dict) -> list[int]:
    answer = post_json(
        f"{urls['up_serve']}/v1/chat/completions", {**body, "return_token_ids": True}
    )
    return answer["choices"][0]["token_ids"]


def generated(urls: dict, which: str, request_json: bytes) -> list[int]:
    answer = post_json(f"{urls[which]}/inference/v1/generate", request_json)
    return answer["choices"][0]["token_ids"]


@pytest.mark.parametrize("images", [[31], [32, 33, 31]])
def test_our_pair_matches_vllm_chat_completions(fleet, images):
    model, urls = fleet
    body = chat_body(model, [data_url(png_bytes(seed=s)) for s in images], **GREEDY)
    expected = monolithic_tokens(urls, body)
    ours = generated(urls, "generate", rendered(urls, "render", body))
    assert ours == expected and len(ours) == 10


def test_upstream_render_output_runs_on_our_generate(fleet):
    model, urls = fleet
    body = chat_body(model, [data_url(png_bytes(seed=34))], **GREEDY)
    assert generated(urls, "generate", rendered(urls, "up_render", body)) == monolithic_tokens(
        urls, body
    )


def test_our_render_output_runs_on_upstream_generate(fleet):
    model, urls = fleet
    body = chat_body(model, [data_url(png_bytes(seed=35))], **GREEDY)
    assert generated(urls, "up_serve", rendered(urls, "render", body)) == monolithic_tokens(
        urls, body
    )


def test_binary_body_end_to_end(fleet):
    model, urls = fleet
    body = chat_body(model, [data_url(png_bytes(seed=36))], **GREEDY)
    r = httpx.post(
        f"{urls['render']}/v1/chat/completions/render",
        json=body,
        headers={"accept": "application/vnd.msgpack"},
        timeout=60,
    )
    req = decode_generate_request(r.content, WireFormat.MSGPACK)
    g = httpx.post(
        f"{urls['generate']}/inference/v1/generate",
        content=encode_generate_request(req, WireFormat.MSGPACK),
        headers={"content-type": "application/vnd.msgpack"},
        timeout=60,
    )
    assert g.status_code == 200 and g.json()["choices"][0]["token_ids"] == monolithic_tokens(
        urls, body
    )


def engine_metric(urls: dict, sample: str) -> float:
    """A sample of vLLM's own engine metrics on our generate server's /metrics (summed over
    labels): the engine's count, not one the service or this test keeps."""
    text = httpx.get(f"{urls['generate']}/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample
    )


def engine_busy(urls: dict) -> float:
    return engine_metric(urls, "vllm:num_requests_running") + engine_metric(
        urls, "vllm:num_requests_waiting"
    )


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_client_disconnect_aborts_the_engine_request(fleet):
    model, urls = fleet
    max_tokens = 3900  # the request would run far longer than the bounds below
    body = chat_body(
        model,
        [data_url(png_bytes(seed=37))],
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        stream=True,
    )
    req = json.loads(rendered(urls, "render", body))
    req["sampling_params"]["ignore_eos"] = True
    assert wait_for(lambda: engine_busy(urls) == 0, 30)  # earlier tests' requests are done
    tokens_before = engine_metric(urls, "vllm:generation_tokens_total")
    control = urls["generate"]
    try:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{urls['generate']}/inference/v1/generate", json=req) as r:
                assert r.status_code == 200
                lines = r.iter_lines()  # held open: closing this iterator would hang up
                for line in lines:
                    if line.startswith("data: {"):
                        break  # one chunk...
                # ...then the engine is frozen with the request in it (vLLM's pause, mode
                # keep), so that however fast this machine decodes, the request cannot end
                # before the hang-up (3900 tokens took seconds on CI),
                paused = client.post(
                    f"{control}/pause", params={"mode": "keep", "clear_cache": "false"}
                )
                assert paused.status_code == 200, paused.text
                assert engine_busy(urls) == 1, "the engine does not hold the request"
    finally:
        # ...and runs again after the hang-up: an engine that still held the request would
        # finish all of its tokens now.
        assert httpx.post(f"{control}/resume", timeout=60).status_code == 200
    # Within the bound the engine has nothing running or waiting,
    assert wait_for(lambda: engine_busy(urls) == 0, 30), "the engine still runs the request"
    # and it stopped early rather than finishing the request.
    produced = engine_metric(urls, "vllm:generation_tokens_total") - tokens_before
    assert 0 < produced < max_tokens
    # The engine is free again: a short request completes at once.
    short = chat_body(model, [data_url(png_bytes(seed=38))], **GREEDY)
    assert len(generated(urls, "generate", rendered(urls, "render", short))) == 10


@pytest.mark.parametrize(
    "constraint",
    [
        {"choice": ["red", "green", "blue"]},
        {"regex": "[a-z]{3,8}-[0-9]{2}"},
        {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
    ],
    ids=["choice", "regex", "json"],
)
def test_structured_outputs_give_upstream_generates_tokens(fleet, constraint):
    # The same render output with the same constraint to our generate and upstream's: the
    # field has upstream's shape and reaches the engine as upstream passes it.
    model, urls = fleet
    body = chat_body(model, [data_url(png_bytes(seed=39))], temperature=0.0, max_tokens=24)
    req = json.loads(rendered(urls, "render", body))
    req["sampling_params"]["structured_outputs"] = constraint
    request_json = json.dumps(req).encode()
    ours = generated(urls, "generate", request_json)
    assert ours and ours == generated(urls, "up_serve", request_json)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_text_mode_answers_as_upstream_generate(fleet, stream):
    """``output_mode: "text"`` with logprobs and transfer parameters: the same render output on
    upstream's generate and ours gives the same text, tokens and logprobs (streams merged per
    choice: how many tokens one chunk carries follows the machine's load)."""
    model, urls = fleet
    body = chat_body(model, [data_url(png_bytes(seed=37))], temperature=0.0, max_tokens=12)
    request = json.loads(rendered(urls, "up_render", body))
    request["sampling_params"] = {**request["sampling_params"], "logprobs": 2}
    request.update(output_mode="text", kv_transfer_params={"do_remote_prefill": False})
    request["stream"] = stream
    merged = []
    for which in ("up_serve", "generate"):
        r = httpx.post(f"{urls[which]}/inference/v1/generate", json=request, timeout=120)
        assert r.status_code == 200, r.text[:1500]
        if stream:
            events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
            answers = [json.loads(e) for e in events if e != "[DONE]"]
        else:
            answers = [r.json()]
        assert {a.get("output_mode") for a in answers} == {"text"}
        merged.append(_merged_choices(answers))
    theirs, ours = merged
    assert ours[0]["text"] and len(ours[0]["token_ids"]) == 12
    assert ours == theirs


def _merged_choices(answers: list[dict]) -> dict[int, dict]:
    """Per choice index: its text, token ids and logprob entries joined, its finish reason."""
    out: dict[int, dict] = {}
    for answer in answers:
        for c in answer["choices"]:
            m = out.setdefault(
                c["index"], {"text": "", "token_ids": [], "logprobs": [], "finish_reason": None}
            )
            m["text"] += c.get("text") or ""
            m["token_ids"] += c.get("token_ids") or []
            m["logprobs"] += (c.get("logprobs") or {}).get("content") or []
            m["finish_reason"] = c.get("finish_reason") or m["finish_reason"]
    return out
