"""TRL's own VLLMClient (what GRPO trainers use) against our generate server, unmodified.

Its weight sync itself is NCCL between CUDA devices and cannot run on this CPU machine; what it
reads and calls around that (server info, world size, the update bracket, cache reset) can.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]


def test_trls_client_finds_what_it_reads_and_calls(fleet):
    from trl.generation.vllm_client import VLLMClient

    model, urls = fleet
    client = VLLMClient(base_url=urls["generate"])
    assert client.model == model
    assert client.get_server_info()["weight_transfer_config"] == {"backend": "tandem_file"}
    assert client.get_world_size() == 1
    client.reset_prefix_cache()
    with client.weight_update():  # start_weight_update ... finish_weight_update, as TRL sends
        pass
    # The next step is its NCCL rendezvous, which TRL itself refuses without CUDA.
    with pytest.raises(NotImplementedError, match="CUDA"):
        client.init_communicator(device="cpu")
