"""make soak: render, generate and the front door under saturating mixed load for minutes; checks
that nothing is lost, answered twice, wrong, refused without cause, or leaking memory.

The load mixes 1-4 images per prompt (repeated from a small pool, or never seen before),
streaming and not, n=1 (greedy) and n=4 (seeded), sent direct (render -> generate), through the
front door's pass-through routes, and as OpenAI chat completions on the front door. Pass:
- no 5xx, and every request answered: generate's access log counts exactly one 200 per request;
- each answer's tokens equal those of the same request replayed alone (a sample of them);
- RSS of every process flat after warm-up (within max(64 MiB, 5%));
- every 429 came when generate's queue was full (``--max-pending`` requests outstanding).
Prints latency percentiles per time window and RSS per process, and writes a PNG plot and the
raw numbers (JSON) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support.images import chat_body, data_url, png_bytes
from tools.servers import ServerProcess, tandem_front, tandem_generate, tandem_render
from tools.tiny_models import ensure_model

RSS_SLACK_BYTES = 64 * 2**20
RSS_SLACK_RATIO = 0.05
IMAGE_POOL = 8
"""Distinct images the "repeated" requests draw from."""
MAX_429_RETRIES = 60
RELEASE_LAG_S = 0.2
"""A request answered this recently may still hold its slot on generate (a stream's slot is
freed just after its last bytes leave; answers of one engine step leave together)."""
GENERATE_ITEM_CACHE_BYTES = 512 * 2**20
ENGINE_MM_CACHE_GB = 0.25
"""vLLM's engine-side item cache on generate (``--mm-processor-cache-gb``): a bounded arena
that fills with fresh images, so its bound is the engine core's allowed RSS growth."""


@dataclass
class SoakConfig:
    seconds: float = 300.0
    concurrency: int = 14
    generate_max_pending: int = 10
    """Below the load's concurrency, so that generate's queue fills and 429s happen."""
    replay: int = 60
    """Answers replayed alone to check their tokens (a seeded sample)."""
    max_tokens: int = 12
    seed: int = 0
    out: Path = Path(".cache/soak")
    window_s: float = 10.0
    rss_every_s: float = 2.0


@dataclass
class Op:
    index: int
    route: str
    """``direct`` (render -> generate), ``front`` (the same through the front door) or ``chat``
    (the front door's OpenAI chat completions)."""
    stream: bool
    n: int
    images: list[int]
    """Image seeds."""

    def sampling(self, max_tokens: int) -> dict[str, Any]:
        if self.n == 1:
            return {"max_tokens": max_tokens, "temperature": 0.0}
        # vLLM refuses n > 1 under greedy sampling: a fixed seed makes the samples repeatable.
        return {"max_tokens": max_tokens, "temperature": 1.0, "seed": 1000 + self.index}

    def request_id(self) -> str:
        return f"soak-{self.index}"


@dataclass
class Outcome:
    op: Op
    started: float
    latency: float
    status: int
    tokens: list[list[int]] | None = None
    echoed_id: str | None = None
    error: str | None = None
    overloaded: list[tuple[int, int]] = field(default_factory=list)
    """For each 429 this op got from generate: the most requests of the load outstanding there
    between sending it and the answer, and those answered within ``RELEASE_LAG_S`` before."""


class Stack:
    """The three services as processes, with their RSS sampled over time."""

    def __init__(self, model: str, generate_max_pending: int) -> None:
        self.render = tandem_render(model, workers=2)
        self.generate = tandem_generate(
            model,
            None,
            "--max-pending",
            str(generate_max_pending),
            "--mm-processor-cache-gb",
            str(ENGINE_MM_CACHE_GB),
            # Within what the process faults in at start-up (tandem_http.memory.MAX_PRETOUCH):
            # the store fills and evicts during the soak, and RSS must not move.
            "--item-cache-bytes",
            str(GENERATE_ITEM_CACHE_BYTES),
        )
        self.servers = [self.render, self.generate]
        try:
            for server in self.servers:
                server.wait_healthy(timeout=300)
            self.front = tandem_front(model, self.render.url, self.generate.url, workers=1)
            self.servers.append(self.front)
            self.front.wait_healthy(timeout=120)
        except BaseException:
            self.stop()  # one that never came up must not leave the others running
            raise

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def processes(servers: list[ServerProcess]) -> dict[str, psutil.Process]:
    """Every process of the given servers (workers and engine cores too), by a readable name."""
    out: dict[str, psutil.Process] = {}
    for server in servers:
        main = psutil.Process(server.proc.pid)
        out[f"{server.name} main"] = main
        for child in main.children(recursive=True):
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
            out[f"{server.name} {child.name()} ({child.pid})"] = child
    return out


def access_count(server: ServerProcess, status: int) -> int:
    return server.log_text(tail=10**9).count(f'"POST /inference/v1/generate HTTP/1.1" {status}')


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """A server-sent event stream's lines, split on CR, LF or CRLF only, as the SSE spec says.
    httpx's ``aiter_lines`` also splits on U+2028, U+0085 and the like, which JSON leaves
    unescaped: random-weight models do sample them, and a chat chunk was cut in two."""
    rest = ""
    async for text in response.aiter_text():
        rest += text
        *lines, rest = rest.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            yield line
    if rest:
        yield rest


class Load:
    """The load generator: ``concurrency`` loops sending ops until the deadline."""

    def __init__(self, cfg: SoakConfig, model: str, render: str, generate: str, front: str):
        self.cfg = cfg
        self.model = model
        self.render, self.generate, self.front = render, generate, front
        self.rng = random.Random(cfg.seed)
        self.next_index = 0
        self.fresh_seed = 10_000
        self.generating = 0
        """Requests of this load that may be in generate's queue now (every path counted)."""
        self._watching: dict[object, int] = {}
        self.finished_at: list[float] = []
        """When each of those requests was answered (for the 429 check)."""
        self.outcomes: list[Outcome] = []
        self._images: dict[int, str] = {}

    def image(self, seed: int) -> str:
        if seed not in self._images:
            self._images[seed] = data_url(png_bytes(seed=seed))
        return self._images[seed]

    def next_op(self) -> Op:
        rng = self.rng
        images = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.6:
                images.append(rng.randrange(IMAGE_POOL))
            else:
                self.fresh_seed += 1
                images.append(self.fresh_seed)
        op = Op(
            index=self.next_index,
            route=rng.choice(["direct", "front", "chat"]),
            stream=rng.random() < 0.5,
            n=4 if rng.random() < 0.25 else 1,
            images=images,
        )
        self.next_index += 1
        return op

    def chat(self, op: Op) -> dict[str, Any]:
        return chat_body(
            self.model,
            [self.image(s) for s in op.images],
            text=f"Describe image set {op.index % 5}.",
            n=op.n,
            **op.sampling(self.cfg.max_tokens),
        )

    async def run(self, deadline: float) -> None:
        limits = httpx.Limits(max_connections=4 * self.cfg.concurrency)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:

            async def loop() -> None:
                while time.monotonic() < deadline:
                    self.outcomes.append(await self.one(http, self.next_op()))

            await asyncio.gather(*(loop() for _ in range(self.cfg.concurrency)))

    async def one(self, http: httpx.AsyncClient, op: Op) -> Outcome:
        started = time.monotonic()
        outcome = Outcome(op, started, 0.0, 0)
        try:
            if op.route == "chat":
                await self._chat(http, op, outcome)
            else:
                base = self.render if op.route == "direct" else self.front
                target = self.generate if op.route == "direct" else self.front
                request = await self._render(http, base, op, outcome)
                if request is not None:
                    await self._generate(http, target, request, op, outcome)
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.latency = time.monotonic() - started
        return outcome

    async def _render(
        self, http: httpx.AsyncClient, base: str, op: Op, outcome: Outcome
    ) -> dict[str, Any] | None:
        r = await http.post(f"{base}/v1/chat/completions/render", json=self.chat(op))
        if r.status_code != 200:
            outcome.status, outcome.error = r.status_code, r.text[:300]
            return None
        request: dict[str, Any] = r.json()
        request["request_id"] = op.request_id()
        if op.stream:
            request["stream"] = True
        return request

    async def _post_generate(
        self, send: Callable[[], Any], outcome: Outcome
    ) -> httpx.Response | None:
        """Send (retrying 429s after their Retry-After); the answer's stream is left open."""
        for _ in range(MAX_429_RETRIES):
            now = time.monotonic()
            recent = sum(1 for t in self.finished_at[-64:] if now - t < RELEASE_LAG_S)
            # Generate admits the request at some moment before it answers (after the front
            # door's render, on the chat route): the most requests outstanding meanwhile.
            token = object()
            self._watching[token] = self.generating
            self.generating += 1
            for key, peak in self._watching.items():
                self._watching[key] = max(peak, self.generating - 1)
            try:
                response: httpx.Response = await send()
            finally:
                peak = self._watching.pop(token)
            if response.status_code != 429:
                return response
            self.generating -= 1
            await response.aclose()
            outcome.overloaded.append((peak, recent))
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
        outcome.error = "still 429 after every retry"
        return None

    async def _generate(
        self, http: httpx.AsyncClient, url: str, request: dict[str, Any], op: Op, outcome: Outcome
    ) -> None:
        def send() -> Any:
            req = http.build_request("POST", f"{url}/inference/v1/generate", json=request)
            return http.send(req, stream=True)

        await self._answer(send, op, outcome, echoes_id=True)

    async def _chat(self, http: httpx.AsyncClient, op: Op, outcome: Outcome) -> None:
        body = {**self.chat(op), "return_token_ids": True, "stream": op.stream}

        def send() -> Any:
            req = http.build_request("POST", f"{self.front}/v1/chat/completions", json=body)
            return http.send(req, stream=True)

        await self._answer(send, op, outcome, echoes_id=False)

    async def _answer(
        self, send: Callable[[], Any], op: Op, outcome: Outcome, *, echoes_id: bool
    ) -> None:
        """Send, then read each sample's token ids from the answer (whole or streamed; generate
        and chat completions name them alike); ``echoes_id``: the answer carries our id (chat
        ids are the front door's own)."""
        response = await self._post_generate(send, outcome)
        if response is None:
            return
        try:
            outcome.status = response.status_code
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode(errors="replace")[:300]
                return
            tokens: dict[int, list[int]] = {}
            if op.stream:
                async for line in sse_lines(response):
                    if not line.startswith("data: {"):
                        continue
                    try:
                        chunk = json.loads(line[6:])
                    except json.JSONDecodeError as exc:  # a broken event: the server's fault
                        outcome.error = f"unreadable stream event: {exc}"
                        return
                    outcome.echoed_id = chunk.get("request_id")
                    for choice in chunk["choices"]:
                        tokens.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
            else:
                answer = json.loads(await response.aread())
                outcome.echoed_id = answer.get("request_id")
                for choice in answer["choices"]:
                    tokens[choice["index"]] = choice["token_ids"]
            outcome.tokens = [tokens.get(i, []) for i in range(op.n)]
            if not echoes_id:
                outcome.echoed_id = op.request_id()
        finally:
            self.generating -= 1
            self.finished_at.append(time.monotonic())
            await response.aclose()

    async def replay(self, http: httpx.AsyncClient, op: Op) -> list[list[int]]:
        """The op's tokens from the same request sent alone, direct, not streamed."""
        r = await http.post(f"{self.render}/v1/chat/completions/render", json=self.chat(op))
        r.raise_for_status()
        request = r.json()
        g = await http.post(f"{self.generate}/inference/v1/generate", json=request)
        g.raise_for_status()
        choices = sorted(g.json()["choices"], key=lambda c: c["index"])
        return [c["token_ids"] for c in choices]


@dataclass
class Report:
    requests: int
    by_route: dict[str, int]
    windows: list[dict[str, float]]
    rss: dict[str, dict[str, float]]
    overloaded: int
    replayed: int
    failures: list[str]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def windows(outcomes: list[Outcome], t0: float, width: float) -> list[dict[str, float]]:
    rows = []
    end = max((o.started + o.latency for o in outcomes), default=t0)
    start = t0
    while start < end:
        done = [o for o in outcomes if start <= o.started + o.latency < start + width]
        lat = [o.latency * 1000 for o in done if o.status == 200]
        rows.append(
            {
                "t": start - t0,
                "answered": float(len(done)),
                "p50_ms": percentile(lat, 50),
                "p95_ms": percentile(lat, 95),
                "p99_ms": percentile(lat, 99),
                "overloaded": float(sum(len(o.overloaded) for o in done)),
            }
        )
        start += width
    return rows


async def held_slots(generate: str) -> float:
    """Requests generate still counts as admitted (its own gauge), once the load has ended."""
    await asyncio.sleep(2.0)
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(f"{generate}/metrics")).text
    for line in text.splitlines():
        if line.startswith("tandem_generate_pending "):
            return float(line.split()[1])
    return float("nan")


def check(
    cfg: SoakConfig,
    load: Load,
    answered_200: int,
    held_after: float,
    rss: dict[str, dict[str, float]],
    mismatches: list[str],
) -> list[str]:
    failures: list[str] = []
    outcomes = load.outcomes
    for o in outcomes:
        if o.status >= 500 or o.status == 0 or o.error:
            failures.append(f"op {o.op.index} ({o.op.route}): {o.status} {o.error}")
        elif o.echoed_id != o.op.request_id():
            failures.append(f"op {o.op.index}: answered with request id {o.echoed_id}")
        elif o.tokens is None or any(not t for t in o.tokens):
            failures.append(f"op {o.op.index}: a sample without tokens")
    if held_after != 0:
        failures.append(f"generate still holds {held_after} admission slots after the load")
    ok = sum(1 for o in outcomes if o.status == 200)
    if answered_200 != ok:
        failures.append(f"generate answered {answered_200} requests with 200; {ok} succeeded")
    for o in outcomes:
        for others, recent in o.overloaded:
            if others + recent < cfg.generate_max_pending:
                failures.append(
                    f"op {o.op.index}: 429 with at most {others} requests outstanding and {recent} "
                    f"just answered (limit {cfg.generate_max_pending})"
                )
    for name, row in rss.items():
        allowed = max(RSS_SLACK_BYTES, RSS_SLACK_RATIO * row["warm"])
        if "EngineCore" in name:
            allowed += ENGINE_MM_CACHE_GB * 2**30
        if row["end"] - row["warm"] > allowed:
            failures.append(
                f"{name}: RSS grew {(row['end'] - row['warm']) / 2**20:.0f} MiB after warm-up"
            )
    return failures + mismatches


def plot(report: Report, rss_series: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    t = [w["t"] for w in report.windows]
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        top.plot(t, [w[key] for w in report.windows], marker="o", label=key.split("_")[0])
    top.set_ylabel("latency per request (ms)")
    top.set_title(f"Tandem soak: {report.requests} requests, {report.overloaded} 429s (retried)")
    top.legend()
    for name, series in rss_series.items():
        bottom.plot([s[0] for s in series], [s[1] / 2**20 for s in series], label=name)
    bottom.set_ylabel("RSS (MiB)")
    bottom.set_xlabel("seconds since start")
    bottom.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def soak(
    cfg: SoakConfig, model: str, render: str, generate: str, front: str, servers: list[Any]
) -> tuple[Report, Load]:
    """Drive the load against running services; ``servers`` are their ServerProcesses (for RSS
    and access logs; generate's is the one with "generate" in its name)."""
    gen_server = next(s for s in servers if "generate" in s.name)
    procs = processes(servers)
    rss_series: dict[str, list[tuple[float, float]]] = {n: [] for n in procs}
    load = Load(cfg, model, render, generate, front)
    before_200 = access_count(gen_server, 200)
    t0 = time.monotonic()
    stop = asyncio.Event()

    async def sample_rss() -> None:
        while not stop.is_set():
            for name, p in procs.items():
                try:
                    rss_series[name].append((time.monotonic() - t0, float(p.memory_info().rss)))
                except psutil.Error:
                    pass
            try:
                await asyncio.wait_for(stop.wait(), cfg.rss_every_s)
            except TimeoutError:
                pass

    sampler = asyncio.create_task(sample_rss())
    await load.run(t0 + cfg.seconds)
    stop.set()
    await sampler
    answered_200 = access_count(gen_server, 200) - before_200
    held_after = await held_slots(generate)

    warm_at = 0.3 * cfg.seconds
    rss: dict[str, dict[str, float]] = {}
    for name, series in rss_series.items():
        if not series:
            continue
        warm = min(series, key=lambda s: abs(s[0] - warm_at))[1]
        rss[name] = {"start": series[0][1], "warm": warm, "end": series[-1][1]}

    mismatches: list[str] = []
    done = [o for o in load.outcomes if o.status == 200 and o.tokens]
    sample = random.Random(cfg.seed).sample(done, min(cfg.replay, len(done)))
    async with httpx.AsyncClient(timeout=300) as http:
        for o in sample:
            alone = await load.replay(http, o.op)
            if alone != o.tokens:
                mismatches.append(
                    f"op {o.op.index} ({o.op.route}, n={o.op.n}, stream={o.op.stream}): "
                    f"{o.tokens} under load, {alone} alone"
                )
        # Replays are requests too: the access-log count above was taken before them.
    by_route: dict[str, int] = {}
    for o in load.outcomes:
        by_route[o.op.route] = by_route.get(o.op.route, 0) + 1
    report = Report(
        requests=len(load.outcomes),
        by_route=by_route,
        windows=windows(load.outcomes, t0, cfg.window_s),
        rss=rss,
        overloaded=sum(len(o.overloaded) for o in load.outcomes),
        replayed=len(sample),
        failures=[],
    )
    report.failures = check(cfg, load, answered_200, held_after, rss, mismatches)
    cfg.out.mkdir(parents=True, exist_ok=True)
    plot(report, rss_series, cfg.out / "soak.png")
    raw = {
        "config": {**asdict(cfg), "out": str(cfg.out)},
        "report": asdict(report),
        "rss_series": rss_series,
    }
    (cfg.out / "soak.json").write_text(json.dumps(raw, indent=1))
    return report, load


def print_report(report: Report, cfg: SoakConfig) -> None:
    print(f"\n{report.requests} requests in {cfg.seconds:.0f} s at concurrency {cfg.concurrency}")
    print(f"by route: {report.by_route}; 429s (then retried): {report.overloaded}")
    print(f"replayed alone: {report.replayed}\n")
    print("| t (s) | answered | p50 ms | p95 ms | p99 ms | 429s |")
    print("|---|---|---|---|---|---|")
    for w in report.windows:
        print(
            f"| {w['t']:.0f} | {w['answered']:.0f} | {w['p50_ms']:.0f} | {w['p95_ms']:.0f} "
            f"| {w['p99_ms']:.0f} | {w['overloaded']:.0f} |"
        )
    print("\n| process | RSS start MiB | after warm-up | end | growth |")
    print("|---|---|---|---|---|")
    for name, row in report.rss.items():
        mib = {k: v / 2**20 for k, v in row.items()}
        print(
            f"| {name} | {mib['start']:.0f} | {mib['warm']:.0f} | {mib['end']:.0f} "
            f"| {mib['end'] - mib['warm']:+.0f} |"
        )
    lat = [w["p50_ms"] for w in report.windows if w["answered"]]
    if lat:
        print(f"\nmedian of window p50s: {statistics.median(lat):.0f} ms")
    print(f"plot and raw numbers: {cfg.out}/soak.png, soak.json")
    print("\nPASS" if not report.failures else "\nFAIL:\n  " + "\n  ".join(report.failures[:30]))


def run(cfg: SoakConfig, model: str | None = None) -> Report:
    """Start the stack, soak it, stop it."""
    model = model or str(ensure_model("qwen2-vl"))
    stack = Stack(model, cfg.generate_max_pending)
    try:
        report, _ = asyncio.run(
            soak(
                cfg,
                model,
                stack.render.url,
                stack.generate.url,
                stack.front.url,
                stack.servers,
            )
        )
    finally:
        stack.stop()
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=SoakConfig.seconds)
    p.add_argument("--concurrency", type=int, default=SoakConfig.concurrency)
    p.add_argument("--generate-max-pending", type=int, default=SoakConfig.generate_max_pending)
    p.add_argument("--replay", type=int, default=SoakConfig.replay)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=SoakConfig.out)
    p.add_argument("--model", help="model folder (default: the tiny Qwen2-VL)")
    args = p.parse_args()
    cfg = SoakConfig(
        seconds=args.seconds,
        concurrency=args.concurrency,
        generate_max_pending=args.generate_max_pending,
        replay=args.replay,
        seed=args.seed,
        out=args.out,
        window_s=max(5.0, args.seconds / 20),
    )
    report = run(cfg, args.model)
    print_report(report, cfg)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
