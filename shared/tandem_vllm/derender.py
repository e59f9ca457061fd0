"""vLLM's derender (``ServingDerender`` over ``OnlineDerenderer``), built one way for render and
the front door, as ``vllm launch render`` builds it (launchers/render/app_state.py)."""

from __future__ import annotations

from argparse import Namespace
from typing import Any, Protocol

from vllm.config import ModelConfig
from vllm.entrypoints.launchers.cli_args import resolve_default_chat_template_kwargs
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
from vllm.entrypoints.scale_out.derender.serving import ServingDerender
from vllm.renderers.chat_utils import load_chat_template
from vllm.renderers.online_derenderer import OnlineDerenderer

__all__ = ["ParserOptions", "model_registry", "online_options", "serving_derender"]


class ParserOptions(Protocol):
    """The settings both services take under vLLM's names (``tandem_vllm.parser_flags``)."""

    @property
    def chat_template(self) -> str | None: ...
    @property
    def tool_call_parser(self) -> str | None: ...
    @property
    def enable_auto_tool_choice(self) -> bool: ...
    @property
    def exclude_tools_when_tool_choice_none(self) -> bool: ...
    @property
    def tool_strict_level(self) -> str: ...
    @property
    def reasoning_parser(self) -> str | None: ...
    @property
    def default_chat_template_kwargs(self) -> dict[str, Any] | None: ...
    @property
    def cohere_format(self) -> str | None: ...


def online_options(
    options: ParserOptions,
    model_config: ModelConfig,
    renderer: Any,
    structured_reasoning_parser: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments vLLM's ``OnlineRenderer`` and ``OnlineDerenderer`` share: the
    template and the tool/reasoning parser options. ``renderer``: a vLLM renderer, or any
    object with its ``tokenizer``, ``get_tokenizer()`` and ``_executor`` (all the derenderer
    reads)."""
    return {
        "model_config": model_config,
        "renderer": renderer,
        "request_logger": None,
        "chat_template": load_chat_template(options.chat_template),
        "chat_template_content_format": "auto",
        "trust_request_chat_template": False,
        "enable_auto_tools": options.enable_auto_tool_choice,
        "exclude_tools_when_tool_choice_none": options.exclude_tools_when_tool_choice_none,
        "tool_parser": options.tool_call_parser,
        "tool_strict_level": options.tool_strict_level,
        "reasoning_parser": options.reasoning_parser or structured_reasoning_parser,
        "default_chat_template_kwargs": resolve_default_chat_template_kwargs(
            Namespace(
                default_chat_template_kwargs=options.default_chat_template_kwargs,
                cohere_format=options.cohere_format,
            )
        ),
    }


def model_registry(model_config: ModelConfig, names: list[str], model: str) -> OpenAIModelRegistry:
    """vLLM's registry of the served names (what ``model`` in a request may say)."""
    return OpenAIModelRegistry(
        model_config=model_config,
        base_model_paths=[BaseModelPath(name=n, model_path=model) for n in names],
    )


def serving_derender(registry: OpenAIModelRegistry, shared: dict[str, Any]) -> ServingDerender:
    """vLLM's derender over ``online_options``' arguments."""
    return ServingDerender(registry, OnlineDerenderer(**shared))
