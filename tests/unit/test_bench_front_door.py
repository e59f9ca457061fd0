"""The front door benchmark's arithmetic: per-hop means and the target verdicts (no servers)."""

from __future__ import annotations

import argparse
import json

import pytest

from tools.bench_front_door import (
    LOADS,
    LoadResult,
    Side,
    bench_targets,
    hop_means,
    load_targets,
    photo_jpeg,
    section,
)
from tools.bench_generate import Result
from tools.bench_report_docs import front_door_md


def side(label: str, c1_ms: float, c8_rps: float, load: str = "448") -> Side:
    c1 = Result(label, 1, [c1_ms / 1000] * 5, 1.0, 0.0, [])
    c8 = Result(label, 8, [0.1] * 80, 80 / c8_rps, 0.0, [])
    return Side(label, {load: LoadResult(c1, c8, {}, {})}, None)


def test_a_hop_mean_is_its_sums_growth_over_its_counts():
    before = {"render": (1.0, 10.0), "idle": (2.0, 4.0)}
    after = {"render": (1.5, 20.0), "idle": (2.0, 4.0)}
    # 0.5 s over 10 new requests; a hop nobody took has no mean (not 0, not a division error).
    assert hop_means(before, after) == {"render": 50.0}


def test_targets_are_judged_on_the_ratio_to_vllm_serve():
    serve = [side("vllm serve", 50, 30)]
    p50, rps = load_targets([side("front door", 54, 30.3)], serve, "448")
    assert (p50["measured"], p50["goal"], p50["met"]) == (1.08, "<= 1.1x", True)
    assert (rps["measured"], rps["goal"], rps["met"]) == (1.01, ">= 1.0x", True)
    p50, rps = load_targets([side("front door", 60, 24)], serve, "448")
    assert (p50["measured"], p50["met"]) == (1.2, False)
    assert (rps["measured"], rps["met"]) == (0.8, False)


def test_the_ratios_use_the_median_round_of_each_side():
    door = [side("front door", 55, 20), side("front door", 57, 27), side("front door", 90, 28)]
    serve = [side("vllm serve", 50, 30), side("vllm serve", 51, 30), side("vllm serve", 49, 31)]
    p50, rps = load_targets(door, serve, "448")
    assert (p50["measured"], rps["measured"]) == (1.14, 0.9)


def test_the_section_names_each_round_and_judges_each_door_config():
    args = argparse.Namespace(loads=["448"], rounds=2, bench_serve=False)
    doors = {"defaults": [side("front door", 54, 30), side("front door", 56, 31)]}
    serve = [side("vllm serve", 50, 30), side("vllm serve", 50, 32)]
    out = section(doors, serve, args)
    assert [(s["config"], s["round"]) for s in out["sides"]] == [
        ("defaults", 1),
        ("defaults", 2),
        ("vllm serve", 1),
        ("vllm serve", 2),
    ]
    assert out["sides"][1]["loads"]["448"]["c8_req_s"] == pytest.approx(31)
    assert [(t["config"], t["met"]) for t in out["targets"]] == [
        ("defaults", True),
        ("defaults", False),  # 30.5 / 31 req/s
    ]
    json.dumps(out)  # what report.json keeps


def test_every_request_of_the_photo_load_gets_its_own_images():
    urls = [u for seed in range(3) for u in LOADS["720p"].urls(seed)]
    assert len(urls) == 9 and len(set(urls)) == 9
    assert photo_jpeg(4)[:3] == b"\xff\xd8\xff"  # a JPEG


def bench_side(label: str, rps: float, ttft_ms: float, worker_work_ms: float) -> Side:
    bench = {"request_throughput": rps, "median_ttft_ms": ttft_ms, "completed": 160}
    bench |= {"num_prompts": 160, "median_tpot_ms": 2.0, "median_e2el_ms": 90.0}
    split = {"worker": 40.0, "worker waiting": 40.0 - worker_work_ms, "worker work": worker_work_ms}
    split |= {"core": 20.0, "core waiting": 17.0, "core work": 3.0, "steps": 5.0}
    return Side(label, {}, bench, {"cpu_ms": {}, "engine_ms": split})


def test_the_engine_worker_is_judged_on_its_work_not_its_cpu():
    # Both workers fill their core (40 ms each at these rates); the door's does 10% more work.
    door = [bench_side("front door", 27, 70, 22.0)]
    serve = [bench_side("vllm serve", 30, 60, 20.0)]
    rps, ttft, work = bench_targets(door, serve)
    assert (rps["measured"], rps["met"]) == (0.9, True)
    assert (ttft["measured"], ttft["met"]) == (1.167, True)
    assert (work["measured"], work["goal"], work["met"]) == (1.1, "<= 1.05x", False)


def test_the_report_shows_each_engine_split_under_vllm_bench_serve():
    args = argparse.Namespace(loads=[], rounds=1, bench_serve=True)
    out = section({"defaults": [bench_side("front door", 27, 70, 22.0)]}, [], args)
    lines = front_door_md(out, [])
    (row,) = [line for line in lines if line.startswith("| front door, round 1 | vllm bench")]
    assert row == (
        "| front door, round 1 | vllm bench serve | 40.0 | 18.0 | 22.0 | 20.0 | 17.0 | 3.0 | 5.0 |"
    )
