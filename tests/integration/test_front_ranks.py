"""TRL's weight sync through the front door over two real generate nodes with the NCCL backend:
every worker joins the trainer's group on its own rank, all with one world size.

TRL's ``VLLMClient`` runs as released: ``init_communicator`` reads ``/server_info`` and
``/get_world_size`` through the door, builds its init info and posts
``/init_weight_transfer_engine``. Only the two NCCL ends, which need GPUs, are stand-ins: the
trainer's (TRL's ``open_trainer_endpoint``, recording the init info it was handed) and each
worker's (a spy put on the nodes' PYTHONPATH, tests/support/nccl_spy, recording the rank and
world size vLLM computed for the worker instead of opening the group).
"""

from __future__ import annotations

import atexit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.support.nccl_spy import spied, spy_env
from tools.servers import (
    CPU_ENGINE_ARGS,
    ServerProcess,
    free_port,
    python_module,
    serving,
    tandem_front,
    tandem_render,
)
from tools.tiny_models import ensure_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,  # two engines of its own: run before the shared fleet exists
]

NCCL = '{"backend": "nccl"}'


def nccl_generate(model: str, record_to: Path) -> ServerProcess:
    """A generate node with the NCCL weight-transfer backend, its workers spied on."""
    port = free_port()
    args = python_module(
        "tandem_generate",
        *("--model", model, "--enable-control-routes", *CPU_ENGINE_ARGS),
        *("--weight-transfer-config", NCCL, "--port", str(port)),
    )
    return ServerProcess("tandem-generate-nccl", args, port, spy_env(record_to))


@pytest.fixture(scope="module")
def nccl_fleet(tmp_path_factory):
    """The door's URL over render and two spied NCCL generate nodes, and each node's record
    file in the order of ``--generate``."""
    model = str(ensure_model("qwen2-vl"))
    spies = [tmp_path_factory.mktemp("spy") / f"g{i}.jsonl" for i in (1, 2)]
    procs = [tandem_render(model), *(nccl_generate(model, s) for s in spies)]
    urls = [p.url for p in procs[1:]]
    # The door starts with the nodes: its /health answers once theirs do.
    door = tandem_front(model, procs[0].url, urls, "--enable-control-routes")
    with serving([*procs, door], timeout=300):
        yield door.url, urls, spies


def test_trls_weight_sync_through_the_door_puts_each_worker_on_its_own_rank(
    nccl_fleet, monkeypatch
):
    from trl.generation import vllm_client as trl

    door, urls, spies = nccl_fleet
    handed: list[dict[str, Any]] = []

    def trainer_end(init_info: dict[str, Any]) -> Any:
        handed.append(dict(init_info))
        return SimpleNamespace(group=SimpleNamespace(store=None, socket=None))

    # TRL's trainer end on vLLM >= 0.28 (the one installed): nccl_common's trainer_init.
    monkeypatch.setattr(trl, "open_trainer_endpoint", trainer_end)

    client = trl.VLLMClient(base_url=door)
    assert client.get_server_info()["weight_transfer_config"] == {"backend": "nccl"}
    assert client.get_world_size() == 2  # one worker on each node
    try:
        # "cuda" without an index: TRL sets no device, so nothing touches CUDA before its post.
        client.init_communicator(device="cuda")
    finally:
        atexit.unregister(client.close_communicator)
        client.close_communicator()

    (trainer,) = handed
    assert trainer["rank_offset"] == 1 and trainer["world_size"] == 3
    joined = [spied(s) for s in spies]
    assert [[(w["rank"], w["world_size"]) for w in node] for node in joined] == [
        [(1, 3)],
        [(2, 3)],
    ], f"each node's workers as they would join the trainer's group ({urls})"
    for node in joined:
        assert (node[0]["master_address"], node[0]["master_port"]) == (
            trainer["master_address"],
            trainer["master_port"],
        )

    info = httpx.get(f"{door}/weight_info").json()
    assert info["weight_version"] is not None
    # Both nodes hold the checkpoint and both joined the trainer's group: both serve.
    assert info["fenced"] == []
    assert [(n["url"], n["weights_id"], n["reason"]) for n in info["nodes"]] == [
        (u, info["weights_id"], None) for u in urls
    ]
