"""Generate's engine keeps no second copy of the items it is fed: vLLM's engine-side processor
cache is off unless the operator sizes it (on this path it was only ever written, never read,
and grew the engine core's RSS with every fresh image up to vLLM's 4 GiB default)."""

from __future__ import annotations

import os

from vllm.multimodal.cache import engine_receiver_cache_from_config

from tandem_generate.__main__ import parse_args


def test_the_engine_core_builds_no_item_cache_by_default(qwen2_dir):
    _, engine_args = parse_args(["--model", qwen2_dir])
    assert engine_receiver_cache_from_config(engine_args.create_engine_config()) is None


def test_the_operators_own_cache_size_still_wins(qwen2_dir):
    _, engine_args = parse_args(["--model", qwen2_dir, "--mm-processor-cache-gb", "0.5"])
    config = engine_args.create_engine_config()
    assert config.model_config.multimodal_config.mm_processor_cache_gb == 0.5
    assert engine_receiver_cache_from_config(config) is not None


def test_onednn_kernel_cache_is_bounded_unless_the_operator_set_it(monkeypatch):
    from tandem_generate.__main__ import bound_kernel_cache
    from tandem_generate.settings import ONEDNN_KERNEL_CACHE

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "7")
    bound_kernel_cache()

    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_KERNEL_CACHE)
    assert os.environ["DNNL_PRIMITIVE_CACHE_CAPACITY"] == "7"


def test_the_engine_core_sends_new_requests_items_whole_unless_the_operator_chose(qwen2_dir):
    """The scheduler that keeps a resumed multimodal request's pixels (the behaviour:
    test_weight_updates' preempted-after-a-prefix-hit test); an operator's own stays."""
    from tandem_generate.engine import resumable_config
    from tandem_generate.vllm_scheduler import WholeItemsAsyncScheduler, WholeItemsScheduler

    _, engine_args = parse_args(["--model", qwen2_dir])
    sched = resumable_config(engine_args.create_engine_config()).scheduler_config
    expected = WholeItemsAsyncScheduler if sched.async_scheduling else WholeItemsScheduler
    assert sched.get_scheduler_cls() is expected

    own = "vllm.v1.core.sched.scheduler.Scheduler"
    _, engine_args = parse_args(["--model", qwen2_dir, "--scheduler-cls", own])
    assert (
        resumable_config(engine_args.create_engine_config()).scheduler_config.scheduler_cls == own
    )
