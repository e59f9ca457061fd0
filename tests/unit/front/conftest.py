"""The door's answer side (vLLM's serving code over the tiny model's tokenizer), shared by the
modules that test the answers the door writes."""

from __future__ import annotations

from typing import Any

import pytest

from tandem_front.settings import FrontSettings
from tests.support.parser_model import parser_model


def door_settings(model_dir: str, **kw: Any) -> FrontSettings:
    """A door over one crafted render (``r1``) and one crafted generate (``g1``)."""
    return FrontSettings(
        render_urls=("http://r1",), generate_urls=("http://g1",), model=model_dir, **kw
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(parser_model(tmp_path_factory.mktemp("door-answers")))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def plain(model_dir):
    """vLLM's answer side without parsers (built once: it loads the tokenizer)."""
    from tandem_front.vllm_answers import VllmAnswers

    return VllmAnswers(door_settings(model_dir))


@pytest.fixture(scope="module")
def parsed(model_dir):
    """vLLM's answer side with the hermes tool parser and the deepseek_r1 reasoning parser."""
    from tandem_front.vllm_answers import VllmAnswers

    return VllmAnswers(
        door_settings(
            model_dir,
            tool_call_parser="hermes",
            enable_auto_tool_choice=True,
            reasoning_parser="deepseek_r1",
        )
    )
