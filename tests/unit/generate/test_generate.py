"""The generate app in-process on a real (CPU) vLLM engine fed by our render output."""

from __future__ import annotations

import json

import msgspec
import pytest

from tandem_wire import SYSTEM_FINGERPRINT_HEADER, WireFormat, encode_generate_request
from tandem_wire.streams import STREAM_CONTENT_TYPE, FrameReader, StreamFrameKind

from ...support.asgi import app_client
from ...support.images import data_url, png_bytes
from .helpers import GREEDY, generate_app, post, render, tokens, with_sampling

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]


@pytest.fixture
def app(qwen2_engine, qwen2_dir):
    return generate_app(qwen2_engine, qwen2_dir)


async def test_json_and_binary_bodies_give_the_same_tokens(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [1], **GREEDY)
    async with app_client(app) as c:
        j = await post(c, req)
        b = await post(c, req, binary=True)
    assert tokens(j) == tokens(b) and len(tokens(j)) == 8
    assert j["request_id"] == req.request_id
    assert j["usage"] == {
        "prompt_tokens": len(req.token_ids),
        "completion_tokens": 8,
        "total_tokens": len(req.token_ids) + 8,
        "prompt_tokens_details": None,
    }
    assert j["choices"][0]["finish_reason"] == "length"


async def test_three_images(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [1, 2, 3], **GREEDY)
    assert len(req.features.mm_hashes["image"]) == 3
    async with app_client(app) as c:
        assert len(tokens(await post(c, req, binary=True))) == 8


async def test_the_hf_processor_never_runs_on_the_generate_path(
    app, qwen2_renderer, qwen2_dir, monkeypatch
):
    from vllm.multimodal.processing import processor as mm_processor

    req = await render(qwen2_renderer, qwen2_dir, [4], **GREEDY)  # render first: it may process

    def refuse(*args, **kwargs):
        raise AssertionError("the multimodal processor ran on the generate path")

    for cls in (mm_processor.BaseMultiModalProcessor, mm_processor.EncDecMultiModalProcessor):
        monkeypatch.setattr(cls, "apply", refuse)
        monkeypatch.setattr(cls, "_call_hf_processor", refuse)
    async with app_client(app) as c:
        assert len(tokens(await post(c, req))) == 8


async def test_n_seed_logprobs_and_prompt_logprobs(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [5])
    req = with_sampling(
        req, n=3, temperature=1.0, seed=7, max_tokens=5, logprobs=2, prompt_logprobs=1
    )
    async with app_client(app) as c:
        a = await post(c, req)
        b = await post(c, req)
    assert [ch["index"] for ch in a["choices"]] == [0, 1, 2]
    assert [tokens(a, i) for i in range(3)] == [tokens(b, i) for i in range(3)]  # seeded
    content = a["choices"][0]["logprobs"]["content"]
    assert [e["token_id"] for e in content] == tokens(a)
    assert all(1 <= len(e["top_logprobs"]) <= 3 and e["logprob"] <= 0 for e in content)
    assert content[0]["top_logprobs"][0]["token_id"] == content[0]["token_id"]
    prompt_lp = a["prompt_logprobs"]
    assert len(prompt_lp) == len(req.token_ids) and prompt_lp[0] is None
    assert all(str(t) in step for t, step in zip(req.token_ids[1:], prompt_lp[1:], strict=True))


async def test_stop_token_ids_min_tokens_and_ignore_eos(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [6], **GREEDY)
    async with app_client(app) as c:
        free = tokens(await post(c, req))
        stop_at = free[3]
        stopped = await post(c, with_sampling(req, stop_token_ids=[stop_at]))
        choice = stopped["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_at
        assert tokens(stopped) == free[: free.index(stop_at) + 1]
        longer = await post(c, with_sampling(req, max_tokens=12, min_tokens=12, ignore_eos=True))
        assert len(tokens(longer)) == 12 and tokens(longer)[:8] == free


async def test_streaming_matches_the_full_answer(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [7], **GREEDY)
    req = msgspec.structs.replace(
        with_sampling(req, logprobs=1), stream=True, stream_options={"include_usage": True}
    )
    async with app_client(app) as c:
        full = await post(c, msgspec.structs.replace(req, stream=False))
        async with c.stream(
            "POST", "/inference/v1/generate", content=msgspec.json.encode(_json_doc(req))
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"
            )
            lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    streamed = [t for ch in chunks for c in ch["choices"] for t in c["token_ids"]]
    assert streamed == tokens(full)
    lp = [e for ch in chunks for c in ch["choices"] for e in c["logprobs"]["content"]]
    assert [e["token_id"] for e in lp] == streamed
    assert chunks[-1]["usage"]["completion_tokens"] == len(streamed)
    assert any(c["finish_reason"] == "length" for ch in chunks for c in ch["choices"])
    # Weight versions ride the last chunk of each sample only, covering its whole output.
    versions = [c["weight_versions"] for ch in chunks for c in ch["choices"]]
    assert versions[-1] == [{"version": "default", "start": 0, "end": len(streamed)}]
    assert all(v is None for v in versions[:-1])


async def test_a_stream_is_sse_unless_the_binary_stream_is_asked_for(
    app, qwen2_renderer, qwen2_dir
):
    """Upstream's SSE for every caller but one that names the binary stream in ``Accept`` (a
    msgpack ``Accept`` alone does not); both carry the same documents."""
    req = await render(qwen2_renderer, qwen2_dir, [9], **GREEDY)
    req = msgspec.structs.replace(
        with_sampling(req, logprobs=1, n=2, temperature=1.0, seed=11),  # seeded: the same twice
        stream=True,
        stream_options={"include_usage": True},
    )
    body = encode_generate_request(req, WireFormat.MSGPACK)
    asks = {
        "none": {},
        "msgpack": {"accept": WireFormat.MSGPACK.content_type},
        "frames": {"accept": f"{STREAM_CONTENT_TYPE}, {WireFormat.MSGPACK.content_type}"},
    }
    got: dict[str, tuple[str, bytes]] = {}
    async with app_client(app) as c:
        for name, accept in asks.items():
            headers = {"content-type": WireFormat.MSGPACK.content_type, **accept}
            async with c.stream(
                "POST", "/inference/v1/generate", content=body, headers=headers
            ) as r:
                assert r.status_code == 200, await r.aread()
                got[name] = (r.headers["content-type"], await r.aread())
    for name in ("none", "msgpack"):
        kind, raw = got[name]
        assert kind.startswith("text/event-stream") and raw.endswith(b"data: [DONE]\n\n")
    kind, raw = got["frames"]
    assert kind == STREAM_CONTENT_TYPE
    reader = FrameReader()
    frames = reader.feed(raw)
    reader.finish()
    assert frames[-1] == (StreamFrameKind.END, b"")
    framed = [msgspec.msgpack.decode(p) for _, p in frames[:-1]]
    sse = [json.loads(b[6:]) for b in got["none"][1].split(b"\n\n") if b[6:7] == b"{"]

    def content(docs):
        """Per sample: tokens, logprob tokens, finish reason, spans; and the usage (the
        engine may cut its outputs into chunks differently from one run to the next)."""
        out = {}
        for d in docs:
            for ch in d["choices"]:
                got = out.setdefault(ch["index"], [[], [], None, None])
                got[0] += ch["token_ids"]
                got[1] += [e["token_id"] for e in ch["logprobs"]["content"]]
                got[2] = ch["finish_reason"] or got[2]
                got[3] = ch["weight_versions"] or got[3]
        return out, docs[-1]["usage"], {d["request_id"] for d in docs}

    assert content(framed) == content(sse)
    samples, usage, request_ids = content(framed)
    assert sorted(samples) == [0, 1]
    assert all(s[1] == s[0] and s[2] in ("length", "stop") for s in samples.values())
    assert usage["completion_tokens"] == sum(len(s[0]) for s in samples.values())
    assert request_ids == {req.request_id}


def _json_doc(req):
    from tandem_wire import WireFormat, encode_generate_request

    return json.loads(encode_generate_request(req, WireFormat.JSON))


async def test_return_token_ids_echoes_prompt_and_placeholders(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [8], **GREEDY)
    req = msgspec.structs.replace(req, return_token_ids=True)
    async with app_client(app) as c:
        answer = await post(c, req)
    assert answer["prompt_token_ids"] == req.token_ids
    ph = req.features.mm_placeholders["image"][0]
    assert answer["mm_placeholders"]["image"][0] == {"offset": ph.offset, "length": ph.length}


async def test_text_only_token_prompt(app, qwen2_dir):
    from tandem_wire import GenerateRequest

    req = GenerateRequest(token_ids=[1017, 82, 88, 282, 1018], sampling_params=dict(GREEDY))
    async with app_client(app) as c:
        assert len(tokens(await post(c, req))) == 8


async def test_models_health_reset_and_metrics(app, qwen2_dir):
    async with app_client(app) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
        assert (await c.get("/v1/models")).json()["data"][0]["id"] == qwen2_dir
        # A state-changing route: refused with no key unless --enable-control-routes.
        assert (await c.post("/reset_prefix_cache")).status_code == 403
        text = (await c.get("/metrics")).text
        assert "tandem_generate_requests" in text
        assert "vllm:num_requests_running{" in text  # the engine's own gauges, beside ours


async def test_api_key_on_every_route_but_health(qwen2_engine, qwen2_dir):
    app = generate_app(qwen2_engine, qwen2_dir, api_key="k")
    async with app_client(app) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.post("/inference/v1/generate", json={"token_ids": [1]})).status_code == 401
        assert (await c.get("/v1/models")).status_code == 401
        ok = await c.get("/v1/models", headers={"authorization": "Bearer k"})
        assert ok.status_code == 200


async def test_every_token_id_and_string_list_is_bounded(app, qwen2_engine, qwen2_dir):
    # Out-of-vocabulary ids in sampling fields, oversized stop lists and wire strings: each a
    # typed 400 naming the field (never a 500 from deep inside vLLM), and the service serves on.
    from tandem_wire import GenerateRequest, WireFormat, encode_generate_request

    vocab = qwen2_engine.vocab_size
    prompt = [1017, 82, 88, 282, 1018]
    cases = [
        ({"allowed_token_ids": [5, vocab]}, "token_out_of_vocabulary", "allowed_token_ids"),
        ({"stop_token_ids": [vocab + 7]}, "token_out_of_vocabulary", "stop_token_ids"),
        ({"logit_bias": {str(vocab): 1.0}}, "token_out_of_vocabulary", "logit_bias"),
        ({"logprob_token_ids": [-1]}, None, None),
        ({"stop": ["x"] * 65}, "invalid_sampling_params", "stop"),
        ({"stop": ["x" * 1025]}, "invalid_sampling_params", "stop"),
        ({"bad_words": [f"y{i}" for i in range(1025)]}, "invalid_sampling_params", "bad_words"),
    ]
    async with app_client(app) as c:
        for fields, type_, field in cases:
            req = GenerateRequest(token_ids=prompt, sampling_params={**GREEDY, **fields})
            r = await c.post(
                "/inference/v1/generate", content=encode_generate_request(req, WireFormat.JSON)
            )
            assert r.status_code == 400, (fields, r.text[:200])
            err = r.json()["error"]
            if type_ is not None:
                assert (err["type"], err["param"]) == (type_, f"sampling_params.{field}"), err
        for doc in (
            {"token_ids": prompt, "request_id": "r" * 257},
            {"token_ids": prompt, "cache_salt": ""},
            {"token_ids": prompt, "cache_salt": "s" * 1025},
        ):
            r = await c.post("/inference/v1/generate", json=doc)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request", r.text
        ok = GenerateRequest(token_ids=prompt, sampling_params={**GREEDY, "allowed_token_ids": [5]})
        assert set(tokens(await post(c, ok))) == {5}


@pytest.mark.parametrize("allowed", [False, True])
async def test_a_callers_priority_reaches_the_engine_only_when_allowed(
    qwen2_engine, qwen2_dir, monkeypatch, allowed
):
    from tandem_wire import GenerateRequest

    seen = []
    original = qwen2_engine.llm.generate

    def spy(*args, **kwargs):
        seen.append(kwargs.get("priority"))
        return original(*args, **kwargs)

    monkeypatch.setattr(qwen2_engine.llm, "generate", spy)
    app = generate_app(qwen2_engine, qwen2_dir, allow_request_priority=allowed)
    req = GenerateRequest(token_ids=[1017, 82, 88], sampling_params=dict(GREEDY), priority=-5)
    async with app_client(app) as c:
        await post(c, req)
    assert seen == [-5 if allowed else 0]


async def test_the_default_body_limit_follows_from_the_model(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    # The tiny Qwen2-VL: 4096 tokens of context, 4 grid cells per image token, a cell is
    # 1176 uint8 values (vLLM's processor leaves normalizing to the model). A request filling
    # the context with image tokens fits; the limit is not a fixed 256 MiB.
    app = generate_app(qwen2_engine, qwen2_dir)
    async with app_client(app) as c:
        limit = app.state.service.max_body_bytes
        pixels = 4096 * 4 * 1176
        assert pixels * 4 // 3 < limit < pixels * 4 // 3 + 8 * 2**20
        r = await c.post("/inference/v1/generate", content=b"x" * (limit + 1))
        assert (r.status_code, r.json()["error"]["type"]) == (413, "payload_too_large")
        # A real request near the top: 3 large images (1024 tokens each), as JSON.
        big = await render(
            qwen2_renderer,
            qwen2_dir,
            [data_url(png_bytes(896, 896, seed=s)) for s in (40, 41, 42)],
            **GREEDY,
        )
        assert len(encode_generate_request(big, WireFormat.JSON)) < limit
        assert len(tokens(await post(c, big))) == 8


async def test_answers_carry_the_engine_fingerprint_as_vllm_serve_computes_it(app, qwen2_engine):
    from vllm import __version__

    body = {"token_ids": [1017, 359, 198], "sampling_params": {"max_tokens": 1}}
    async with app_client(app) as c:
        whole = await c.post("/inference/v1/generate", json=body)
        async with c.stream(
            "POST", "/inference/v1/generate", json={**body, "stream": True}
        ) as streamed:
            await streamed.aread()
    told = {
        whole.headers.get(SYSTEM_FINGERPRINT_HEADER),
        streamed.headers.get(SYSTEM_FINGERPRINT_HEADER),
    }
    # vllm-<version>-<first 8 of the engine config's hash>, as vllm serve's default mode.
    assert told == {f"vllm-{__version__}-{qwen2_engine.vllm_config.compute_hash()[:8]}"}


async def test_text_mode_answers_the_engines_text_and_decoded_logprobs(
    app, qwen2_renderer, qwen2_dir
):
    """``output_mode: "text"`` (vLLM's main branch): each choice also carries the engine's
    detokenized text (a stop string cut from it, not from ``token_ids``), logprobs carry the
    decoded tokens and their bytes; streamed, the text comes as deltas."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    req = await render(qwen2_renderer, qwen2_dir, [5], temperature=0.0, max_tokens=12)
    async with app_client(app) as c:
        plain = await post(c, req)
        ids = tokens(plain)
        as_text = msgspec.structs.replace(with_sampling(req, logprobs=2), output_mode="text")
        answer = await post(c, as_text)
        choice = answer["choices"][0]
        assert answer["output_mode"] == "text"
        assert choice["token_ids"] == ids  # the same sampling, tokens and all
        assert choice["text"] == tokenizer.decode(ids, skip_special_tokens=True)
        content = choice["logprobs"]["content"]
        assert [len(e["top_logprobs"]) for e in content] == [2] * len(ids)
        for e, t in zip(content, ids, strict=True):
            alone = tokenizer.decode([t])
            if "\ufffd" not in alone:  # a split UTF-8 piece is completed from the tokens before
                assert e["token"] == alone
        assert all(bytes(e["bytes"]).decode() == e["token"] for e in content)
        assert all(e["top_logprobs"][0]["token"] == e["token"] for e in content)

        # A stop string: the text ends before it, the tokens that made it stay.
        assert len(choice["text"]) >= 4
        stop = choice["text"][len(choice["text"]) // 2 :][:3]
        cut = await post(c, with_sampling(as_text, stop=[stop], logprobs=None))
        assert cut["choices"][0]["text"] == choice["text"].split(stop)[0]

        streamed = msgspec.structs.replace(as_text, stream=True)
        async with c.stream(
            "POST", "/inference/v1/generate", content=msgspec.json.encode(_json_doc(streamed))
        ) as r:
            lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(ch["output_mode"] == "text" for ch in chunks)
    assert "".join(c["text"] for ch in chunks for c in ch["choices"]) == choice["text"]


@pytest.mark.parametrize("flag", [False, True])
async def test_usage_tells_the_prefix_cache_hits_when_asked(qwen2_engine, qwen2_dir, flag):
    """As upstream's ``--enable-prompt-tokens-details``: the engine's own count of prompt
    tokens its prefix cache covered, whole and in the usage chunk; or only for a request that
    asks (``PROMPT_TOKENS_DETAILS_HEADER``, what the door asks for the Responses API)."""
    from tandem_wire import PROMPT_TOKENS_DETAILS_HEADER, GenerateRequest

    app = generate_app(qwen2_engine, qwen2_dir, enable_prompt_tokens_details=flag)
    prompt = [20 + (7 * i + (3 if flag else 0)) % 900 for i in range(600)]
    req = GenerateRequest(token_ids=prompt, sampling_params=dict(GREEDY))
    asked = {"content-type": "application/json", PROMPT_TOKENS_DETAILS_HEADER: "true"}
    body = encode_generate_request(req, WireFormat.JSON)
    streamed = msgspec.structs.replace(req, stream=True, stream_options={"include_usage": True})
    async with app_client(app) as c:
        await post(c, req)  # the prompt is now in the prefix cache
        plain = (await post(c, req))["usage"]
        told = (await c.post("/inference/v1/generate", content=body, headers=asked)).json()
        async with c.stream(
            "POST",
            "/inference/v1/generate",
            content=msgspec.json.encode(_json_doc(streamed)),
            headers=asked,
        ) as r:
            lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: {")]
    cached = told["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < len(prompt)  # whole blocks of it; the last token is always computed
    assert json.loads(lines[-1][6:])["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
    assert plain["prompt_tokens_details"] == ({"cached_tokens": cached} if flag else None)
