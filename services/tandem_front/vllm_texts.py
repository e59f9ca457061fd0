"""vLLM adapter of the front door: the tokenizer, vLLM's own incremental detokenizer (text and
stop-string cuts as ``vllm serve`` makes them) and vLLM's OpenAI response models.

The only module of tandem_front that imports vLLM (a CPU import: tokenizer files only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionResponse,
    CompletionStreamResponse,
)
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer
from vllm.v1.engine.logprobs import LogprobsProcessor

from tandem_vllm.upstream_names import check_upstream_names

from .settings import FrontSettings

__all__ = ["VllmTexts", "VllmTextStream"]

# The SamplingParams fields that decide detokenized text and stop-string cuts.
_TEXT_FIELDS = (
    "stop",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)

_SHAPES: dict[str, Any] = {
    "chat": ChatCompletionResponse,
    "chat_chunk": ChatCompletionStreamResponse,
    "completion": CompletionResponse,
    "completion_chunk": CompletionStreamResponse,
}


class VllmTextStream:
    """One sample's text, fed token ids as the engine made them."""

    def __init__(self, detokenizer: IncrementalDetokenizer) -> None:
        self._detok = detokenizer

    def feed(self, token_ids: Sequence[int], stop_terminated: bool) -> str | None:
        """Add tokens (one engine step at a time, as vLLM's output processor does); the stop
        string matched, if any. ``stop_terminated``: the last token is an EOS/stop token."""
        return self._detok.update(list(token_ids), stop_terminated)

    def text(self, *, finished: bool, delta: bool) -> str:
        return self._detok.get_next_output_text(finished, delta)


class VllmTexts:
    """Tokenizer-side work of the OpenAI routes, done by vLLM's own code."""

    def __init__(self, settings: FrontSettings) -> None:
        check_upstream_names(["front"])  # a vLLM upgrade fails here, not mid-request
        self.tokenizer = get_tokenizer(
            settings.tokenizer or settings.model, trust_remote_code=settings.trust_remote_code
        )
        # vLLM's own logprob-token decoding, for its correction of byte-fallback pieces.
        self._logprobs = LogprobsProcessor(
            tokenizer=self.tokenizer,
            logprobs=None,
            prompt_logprobs=None,
            cumulative_logprob=None,
            num_logprobs=None,
            num_prompt_logprobs=None,
        )

    def stream(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> VllmTextStream:
        given = {k: sampling[k] for k in _TEXT_FIELDS if sampling.get(k) is not None}
        params = msgspec.convert(given, SamplingParams)
        request = EngineCoreRequest(
            request_id="front",
            prompt_token_ids=prompt_token_ids,
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=0.0,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        return VllmTextStream(IncrementalDetokenizer.from_new_request(self.tokenizer, request))

    def logprob_tokens(self, token_ids: list[int], context: list[int]) -> list[str]:
        """The texts of one position's logprob tokens (sampled first, then the top ones) as
        vLLM's engine writes them: each token alone, a piece of a split UTF-8 character
        completed from ``context`` (the tokens sampled before) or left empty."""
        decoded = convert_ids_list_to_tokens(self.tokenizer, token_ids)
        return self._logprobs._verify_tokens(decoded, token_ids, context)

    def shape(self, kind: str, fields: dict[str, Any], *, chunk: bool = False) -> bytes:
        """``fields`` through vLLM's response model ``kind``, serialized as ``vllm serve``
        does (full documents whole; stream chunks without unset fields)."""
        model = _SHAPES[kind].model_validate(fields)
        if chunk:
            exclude_none = not fields.get("choices")  # the usage-only chunk, as upstream
            text: str = model.model_dump_json(exclude_unset=True, exclude_none=exclude_none)
            return text.encode()
        return json.dumps(model.model_dump(), ensure_ascii=False, separators=(",", ":")).encode()
