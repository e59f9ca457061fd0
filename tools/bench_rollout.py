"""GRPO-shaped rollout batch: ours through ``tandem_client.rollout`` against upstream's pair.

One batch = 32 prompts given as token ids, 2 noise images of 448x448 per prompt, ``n=4``,
``max_tokens=16``, ``temperature=1.0``, ``logprobs=0``. Paths, side by side in one run:
- ours: ``tandem_client.rollout`` (binary bodies) against our render and generate;
- upstream pair, driven the way TRL's ``VLLMClient`` does it: each prompt's images rendered by an
  images-only chat on ``vllm launch render``, the placeholders re-pointed at the image-token runs
  of the prompt's own token ids, then ``/inference/v1/generate`` on ``vllm serve`` with ``n=4``;
- upstream monolithic: ``/v1/chat/completions`` with the two images and the prompt as text.
Each path runs a batch of fresh images, then the same batch again (repeated images). Reported:
wall time, bytes on the wire (request + response bodies), API-process CPU per side, and whether
every completion stayed within ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from tandem_client import AsyncTandemClient
from tests.support.images import png_bytes
from tools.servers import ServerProcess

PROMPTS = 32
IMAGES_PER_PROMPT = 2
SIZE = 448
N = 4
MAX_TOKENS = 16
TARGET_VS_UPSTREAM_PAIR = 0.7
PROMPT_TEXT = (
    "<|im_start|>user\n"
    + "<|vision_start|><|image_pad|><|vision_end|>" * IMAGES_PER_PROMPT
    + "Compare the two pictures.<|im_end|>\n<|im_start|>assistant\n"
)
TIMEOUT = httpx.Timeout(600.0)


@dataclass
class RolloutRun:
    label: str
    batch: str
    seconds: float
    bytes_sent: int
    bytes_received: int
    cpu_s: dict[str, float]
    completion_lengths: list[int] = field(default_factory=list)

    @property
    def within_max_tokens(self) -> bool:
        lengths = self.completion_lengths
        return len(lengths) == PROMPTS * N and all(0 < n <= MAX_TOKENS for n in lengths)


class CountingTransport(httpx.AsyncBaseTransport):
    """Counts request and response body bytes on the way through, as they are on the wire
    (compressed ones compressed: the answer is passed on as it came)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent = 0
        self.received = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.sent += len(body)
        response = await self.inner.handle_async_request(request)
        content = b"".join([chunk async for chunk in response.aiter_raw()])
        await response.aclose()
        self.received += len(content)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=httpx.ByteStream(content),
            request=request,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def cpu_seconds(servers: dict[str, ServerProcess]) -> dict[str, float]:
    """CPU of each server's API process (with its worker processes; a generate server's
    children are its engine core and workers, which do the same work on every path: not
    counted)."""
    out = {}
    for name, server in servers.items():
        proc = psutil.Process(server.proc.pid)
        procs = [proc]
        if name != "generate":
            procs += proc.children(recursive=True)
        out[name] = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    return out


def batch_images(seed: int) -> list[list[bytes]]:
    return [
        [png_bytes(SIZE, SIZE, seed=seed + IMAGES_PER_PROMPT * i + j) for j in range(2)]
        for i in range(PROMPTS)
    ]


def prompt_ids(model: str) -> tuple[list[int], int]:
    """The prompt's token ids (one image pad per image) and the image pad's id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = list(tok.encode(PROMPT_TEXT, add_special_tokens=False))
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert isinstance(pad, int)  # one token in, one id out
    return ids, pad


async def _measure(
    label: str,
    batch: str,
    servers: dict[str, ServerProcess],
    run: Callable[[], Awaitable[list[int]]],
    transport: CountingTransport,
) -> RolloutRun:
    sent, received = transport.sent, transport.received
    before = cpu_seconds(servers)
    t0 = time.perf_counter()
    lengths = await run()
    seconds = time.perf_counter() - t0
    after = cpu_seconds(servers)
    cpu = {k: after[k] - before[k] for k in servers}
    return RolloutRun(
        label,
        batch,
        seconds,
        transport.sent - sent,
        transport.received - received,
        cpu,
        lengths,
    )


def ours(
    model: str,
    render: ServerProcess,
    generate: ServerProcess,
    ids: list[int],
    compression: str | None = None,
) -> Callable[[str, list[list[bytes]]], RolloutRun]:
    """One client for every batch, as a trainer keeps one across steps: an image the generate
    node already holds is sent as its hash only."""
    servers = {"render": render, "generate": generate}
    loop = asyncio.new_event_loop()
    transport = CountingTransport()
    client = AsyncTandemClient(
        render.url,
        generate.url,
        model=model,
        transport=transport,
        timeout_s=600,
        compression=compression,
    )

    def one(batch: str, images: list[list[bytes]]) -> RolloutRun:
        async def run() -> list[int]:
            out = await client.rollout(
                [ids] * PROMPTS,
                images,
                n=N,
                max_tokens=MAX_TOKENS,
                temperature=1.0,
                logprobs=0,
                progress=False,
            )
            return [len(c) for c in out.completion_ids]

        label = "ours: tandem_client.rollout (binary" + (
            f", {compression})" if compression else ")"
        )
        return loop.run_until_complete(_measure(label, batch, servers, run, transport))

    return one


def trl_front_door(
    model: str, front: ServerProcess, servers: dict[str, ServerProcess], ids: list[int], pad: int
) -> Callable[[str, list[list[bytes]]], RolloutRun]:
    """TRL's own ``VLLMClient`` (unmodified) against the front door: images-only renders for
    the features, placeholders re-pointed at the prompt's image runs, generate with ``n``."""
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=front.url)
    counted: list[tuple[int, int]] = []
    post = client.session.post

    def counting_post(url: str, **kwargs: Any) -> Any:
        r = post(url, **kwargs)
        body = r.request.body
        counted.append((len(body) if isinstance(body, bytes) else 0, len(r.content)))
        return r

    client.session.post = counting_post  # type: ignore[method-assign, assignment]

    def one(batch: str, images: list[list[bytes]]) -> RolloutRun:
        from PIL import Image

        async def run() -> list[int]:
            def blocking() -> list[int]:
                pil: list[list[Any] | None] = [
                    [Image.open(io.BytesIO(b)) for b in imgs] for imgs in images
                ]
                features = client.image_features(pil)
                placed = [_repoint(ids, pad, f) for f in features if f is not None]
                out = client.generate(
                    prompts=[p for p, _ in placed],
                    features=[f for _, f in placed],
                    n=N,
                    temperature=1.0,
                    max_tokens=MAX_TOKENS,
                    logprobs=0,
                )
                return [len(c) for c in out["completion_ids"]]

            return await asyncio.to_thread(blocking)

        transport = CountingTransport()  # unused: requests counts itself
        del counted[:]
        result = asyncio.run(
            _measure("front door, TRL's VLLMClient", batch, servers, run, transport)
        )
        result.bytes_sent = sum(s for s, _ in counted)
        result.bytes_received = sum(r for _, r in counted)
        return result

    return one


def _b64_png(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _repoint(
    ids: list[int], pad: int, features: dict[str, Any]
) -> tuple[list[int], dict[str, Any]]:
    """Expand each image pad token of ``ids`` to its item's length and move the placeholders
    there (what TRL's trainer does with the features of an images-only render)."""
    ranges = features["mm_placeholders"]["image"]
    out: list[int] = []
    moved = []
    it = iter(ranges)
    for t in ids:
        if t == pad:
            r = next(it)
            moved.append({"offset": len(out), "length": r["length"]})
            out.extend([pad] * r["length"])
        else:
            out.append(t)
    return out, {**features, "mm_placeholders": {"image": moved}}


def upstream_pair(
    model: str, render: ServerProcess, serve: ServerProcess, ids: list[int], pad: int
) -> Callable[[str, list[list[bytes]]], RolloutRun]:
    servers = {"render": render, "generate": serve}

    def one(batch: str, images: list[list[bytes]]) -> RolloutRun:
        transport = CountingTransport()

        async def run() -> list[int]:
            async with httpx.AsyncClient(timeout=TIMEOUT, transport=transport) as client:

                async def prompt(imgs: list[bytes]) -> list[int]:
                    parts = [{"type": "image_url", "image_url": {"url": _b64_png(b)}} for b in imgs]
                    chat = {"model": model, "messages": [{"role": "user", "content": parts}]}
                    r = await client.post(f"{render.url}/v1/chat/completions/render", json=chat)
                    r.raise_for_status()
                    token_ids, features = _repoint(ids, pad, r.json()["features"])
                    body = {
                        "model": model,
                        "token_ids": token_ids,
                        "features": features,
                        "sampling_params": {
                            "n": N,
                            "temperature": 1.0,
                            "max_tokens": MAX_TOKENS,
                            "logprobs": 0,
                            "output_kind": 2,  # FINAL_ONLY, as TRL sends it
                        },
                    }
                    g = await client.post(f"{serve.url}/inference/v1/generate", json=body)
                    g.raise_for_status()
                    return [len(c["token_ids"]) for c in g.json()["choices"]]

                per_prompt = await asyncio.gather(*(prompt(imgs) for imgs in images))
            return [n for lengths in per_prompt for n in lengths]

        label = "upstream pair, TRL-style (JSON)"
        return asyncio.run(_measure(label, batch, servers, run, transport))

    return one


def upstream_monolithic(
    model: str, serve: ServerProcess
) -> Callable[[str, list[list[bytes]]], RolloutRun]:
    servers = {"generate": serve}
    text = "Compare the two pictures."

    def one(batch: str, images: list[list[bytes]]) -> RolloutRun:
        transport = CountingTransport()

        async def run() -> list[int]:
            async with httpx.AsyncClient(timeout=TIMEOUT, transport=transport) as client:

                async def prompt(imgs: list[bytes]) -> list[int]:
                    parts: list[dict[str, Any]] = [
                        {"type": "image_url", "image_url": {"url": _b64_png(b)}} for b in imgs
                    ]
                    parts.append({"type": "text", "text": text})
                    body = {
                        "model": model,
                        "messages": [{"role": "user", "content": parts}],
                        "n": N,
                        "temperature": 1.0,
                        "max_tokens": MAX_TOKENS,
                        "logprobs": True,
                        "top_logprobs": 0,
                    }
                    r = await client.post(f"{serve.url}/v1/chat/completions", json=body)
                    r.raise_for_status()
                    return [len(c["logprobs"]["content"]) for c in r.json()["choices"]]

                per_prompt = await asyncio.gather(*(prompt(imgs) for imgs in images))
            return [n for lengths in per_prompt for n in lengths]

        return asyncio.run(_measure("upstream monolithic chat", batch, servers, run, transport))

    return one


def print_table(runs: list[RolloutRun]) -> None:
    print(
        f"\nRollout batch: {PROMPTS} token-id prompts x {IMAGES_PER_PROMPT} noise images "
        f"{SIZE}x{SIZE}, n={N}, max_tokens={MAX_TOKENS}, temperature 1.0, logprobs 0"
    )
    row = "{:<38} {:<9} {:>7} {:>9} {:>9} {:>11} {:>13} {:>7}"
    print(
        row.format(
            "path",
            "images",
            "wall s",
            "sent MB",
            "recv MB",
            "render CPU s",
            "generate CPU s",
            "<=max",
        )
    )
    for r in runs:
        print(
            row.format(
                r.label,
                r.batch,
                f"{r.seconds:.2f}",
                f"{r.bytes_sent / 1e6:.1f}",
                f"{r.bytes_received / 1e6:.1f}",
                f"{r.cpu_s.get('render', 0.0):.2f}",
                f"{r.cpu_s.get('generate', 0.0):.2f}",
                "yes" if r.within_max_tokens else "NO",
            )
        )
    by = {(r.label.split(":")[0].split(",")[0], r.batch): r for r in runs}
    for batch in ("fresh", "repeated"):
        ours_run, pair = by.get(("ours", batch)), by.get(("upstream pair", batch))
        if ours_run is None or pair is None:
            continue
        ratio = ours_run.seconds / pair.seconds
        met = "met" if ratio <= TARGET_VS_UPSTREAM_PAIR else "NOT met"
        print(
            f"{batch} images: wall ours / upstream pair = {ratio:.2f}x "
            f"(target <= {TARGET_VS_UPSTREAM_PAIR}x: {met}); bytes sent "
            f"{ours_run.bytes_sent / max(1, pair.bytes_sent):.2f}x"
        )
