"""RL rollouts shaped like TRL's vLLM client: token-id prompts and images in, token ids out."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from tandem_wire import GenerateResponse, WeightVersionSpan

from .media import ImageLike

if TYPE_CHECKING:
    from .client import AsyncTandemClient

__all__ = ["RolloutResult", "rollout"]


@dataclass
class RolloutResult:
    """One batch of rollouts. Completions are prompt-major: prompt i's samples are
    ``completion_ids[i * n : (i + 1) * n]``."""

    prompt_ids: list[list[int]]
    """Per prompt, the token ids the model saw (image placeholders expanded)."""

    completion_ids: list[list[int]]
    """Per completion, the sampled token ids."""

    logprobs: list[list[list[float]]] | None
    """Per completion and token: the sampled token's logprob, then the top alternatives'
    (``logprobs + 1`` values at most); None when ``logprobs`` was None."""

    logprob_token_ids: list[list[list[int]]] | None
    """The token ids of ``logprobs``, same shape (the sampled token first)."""

    finish_reasons: list[str | None]
    """Per completion: ``stop`` or ``length``."""

    weight_versions: list[list[WeightVersionSpan] | None] = field(default_factory=list)
    """Per completion: which weight version sampled which of its tokens (one span unless
    the weights changed while it ran); None where the node reported none."""

    def versions(self) -> list[str | None]:
        """Per completion, the version that sampled its last token."""
        return [spans[-1].version if spans else None for spans in self.weight_versions]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["weight_versions"] = [
            None if spans is None else [msgspec.structs.asdict(s) for s in spans]
            for spans in self.weight_versions
        ]
        return out


def _progress(total: int, enabled: bool | None) -> Any:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, disable=not show, desc="rollout", unit="prompt")


async def rollout(
    client: AsyncTandemClient,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    images: Sequence[Sequence[ImageLike] | None] | None = None,
    *,
    mm_processor_kwargs: dict[str, Any] | None = None,
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    max_tokens: int = 16,
    logprobs: int | None = 0,
    seed: int | None = None,
    model: str | None = None,
    batch_size: int = 8,
    progress: bool | None = None,
) -> RolloutResult:
    """Render every prompt (``batch_size`` per render request, spread over render nodes) and
    sample ``n`` completions for each (all in flight at once, bounded by the client)."""
    if images is not None and len(images) != len(prompts):
        raise ValueError("images needs one entry (a list of images or None) per prompt")
    sampling = {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "max_tokens": max_tokens,
        "logprobs": logprobs,
        "seed": seed,
    }
    # Render resolves them (vLLM's own to_sampling_params: max_tokens clamped to the room
    # left) and writes every one generate must read; generate takes its document as it is.
    # Typed loosely: they are sampling fields, never render_completion's media arguments.
    sampling_fields: dict[str, Any] = {k: v for k, v in sampling.items() if v is not None}
    bar = _progress(len(prompts), progress)

    async def one_batch(start: int) -> list[tuple[list[int], GenerateResponse]]:
        stop = start + batch_size
        batch = [list(p) if not isinstance(p, str) else p for p in prompts[start:stop]]
        requests = await client.render_completion(
            batch,  # type: ignore[arg-type]
            images=None if images is None else images[start:stop],
            model=model,
            mm_processor_kwargs=mm_processor_kwargs,
            **sampling_fields,
        )
        answers = await asyncio.gather(*(client.generate(r) for r in requests))
        bar.update(len(batch))
        return [(list(r.token_ids), a) for r, a in zip(requests, answers, strict=True)]

    try:
        batches = await asyncio.gather(*(one_batch(i) for i in range(0, len(prompts), batch_size)))
    finally:
        bar.close()
    result = RolloutResult([], [], [] if logprobs is not None else None, None, [])
    if logprobs is not None:
        result.logprob_token_ids = []
    for batch in batches:
        for prompt_ids, answer in batch:
            result.prompt_ids.append(prompt_ids)
            for choice in sorted(answer.choices, key=lambda c: c.index):
                result.completion_ids.append(list(choice.token_ids or []))
                result.finish_reasons.append(choice.finish_reason)
                result.weight_versions.append(choice.weight_versions)
                if result.logprobs is not None and result.logprob_token_ids is not None:
                    content = choice.logprobs.content if choice.logprobs else None
                    steps = content or []
                    result.logprobs.append(
                        [[t.logprob for t in s.top_logprobs] or [s.logprob] for s in steps]
                    )
                    result.logprob_token_ids.append(
                        [[t.token_id for t in s.top_logprobs] or [s.token_id] for s in steps]
                    )
    return result
