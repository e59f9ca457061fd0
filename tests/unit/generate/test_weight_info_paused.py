"""A node's ``/weight_info`` tells whether its engine is paused: a router sends a paused node
no request while another may serve (one that missed a ``/resume`` would hold them forever)."""

from __future__ import annotations

import pytest

from .test_weight_control_calls import control

pytestmark = pytest.mark.anyio


async def test_weight_info_tells_whether_the_engine_is_paused(qwen2_dir):
    ctl, llm = control(qwen2_dir, "tandem_file")
    assert (await ctl.weight_info()).paused is False
    await ctl.pause("keep", clear_cache=False)
    assert llm.paused and (await ctl.weight_info()).paused is True
    await ctl.resume()
    assert (await ctl.weight_info()).paused is False
