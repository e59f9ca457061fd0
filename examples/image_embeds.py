"""Send an image as precomputed embeddings, and check that it gives the image's own tokens.

The model's own vision tower (transformers, on the CPU) turns the image into ``image_embeds``
(one row per placeholder token) and ``image_grid_thw``; they go to render as one safetensors
file in an ``image_embeds`` content part (never pickle: render refuses ``torch.save`` bytes);
render expands the placeholders and generate feeds the engine without running the vision tower.
The same chat with the image itself then gives the same greedy tokens. Both services must be
started with ``--enable-mm-embeds`` (``make run`` does, for the Qwen-VL models).

    python examples/image_embeds.py [--render-url URL] [--generate-url URL] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
from typing import Any

import httpx
from media_parts import red_png


def vision_tower_embeds(model: str, image: bytes) -> tuple[Any, Any]:
    """(embeddings, grid) of ``image`` by the model's own processor and vision tower: what a
    caller with an encoder of its own (or an encoder cache) would send."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    inputs = processor.image_processor(
        images=[Image.open(io.BytesIO(image)).convert("RGB")], return_tensors="pt"
    )
    vlm = AutoModelForImageTextToText.from_pretrained(model, dtype="auto")
    with torch.no_grad():
        out = vlm.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    (embeds,) = out.pooler_output  # one image: (rows, hidden_size)
    return embeds, inputs["image_grid_thw"][0]


def embeds_part(embeds: Any, grid: Any) -> dict[str, Any]:
    """The content part: one safetensors file holding exactly the two tensors, base64 in JSON
    (in a msgpack body the raw file bytes go as they are)."""
    from safetensors.torch import save

    blob = save({"image_embeds": embeds.contiguous(), "image_grid_thw": grid.contiguous()})
    return {"type": "image_embeds", "image_embeds": base64.b64encode(blob).decode("ascii")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--render-url", default=os.environ.get("RENDER_URL", "http://127.0.0.1:8100")
    )
    parser.add_argument(
        "--generate-url", default=os.environ.get("GENERATE_URL", "http://127.0.0.1:8200")
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    http = httpx.Client(headers=headers, timeout=300)
    # The served model's name: a local folder here (a hub name works with a hub).
    model = http.get(f"{args.render_url}/v1/models").raise_for_status().json()["data"][0]["id"]
    image = red_png()
    embeds, grid = vision_tower_embeds(model, image)
    shape = tuple(embeds.shape)
    print(f"embeddings: {shape} {embeds.dtype}, grid {grid.tolist()}", file=sys.stderr)

    def greedy_tokens(part: dict[str, Any]) -> list[int]:
        content = [part, {"type": "text", "text": "What color is this image?"}]
        chat = {"model": model, "messages": [{"role": "user", "content": content}]}
        rendered = http.post(f"{args.render_url}/v1/chat/completions/render", json=chat)
        request = rendered.raise_for_status().json()
        request["sampling_params"] = {
            **request["sampling_params"],
            "temperature": 0.0,
            "max_tokens": args.max_tokens,
        }
        answer = http.post(f"{args.generate_url}/inference/v1/generate", json=request)
        return answer.raise_for_status().json()["choices"][0]["token_ids"]

    from_embeds = greedy_tokens(embeds_part(embeds, grid))
    url = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
    from_image = greedy_tokens({"type": "image_url", "image_url": {"url": url}})
    print(f"tokens from the embeddings: {from_embeds}", file=sys.stderr)
    print(f"tokens from the image:      {from_image}", file=sys.stderr)
    # Equal on the tiny test models; a real model's bf16 tower in transformers and in vLLM may
    # round differently, so a late token can differ there.
    print(f"same tokens: {from_embeds == from_image}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
