"""One greedy completion of a fixed prompt on a generate node (or a door), and the label its
tokens carry: how the fleet tests tell which weights answered."""

from __future__ import annotations

import httpx

PROMPT = [1017, 359, 261, 198, 82, 88, 1018, 198, 1017, 436, 198]


def completion(url: str, request_id: str, max_tokens: int = 8) -> tuple[list[int], str]:
    """(token ids, the one weight label over them) of a greedy completion of ``PROMPT``."""
    body = {
        "request_id": request_id,
        "token_ids": PROMPT,
        "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens},
    }
    r = httpx.post(f"{url}/inference/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    [label] = {v["version"] for v in choice["weight_versions"]}
    return choice["token_ids"], label
