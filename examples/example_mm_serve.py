"""Render a chat with an image, generate from the render output, decode the tokens: plain HTTP.

The upstream flow, with no Tandem library: it works against Tandem's pair and against vLLM's own
(`vllm launch render` + `vllm serve --enable-scale-out`) alike.

    python examples/example_mm_serve.py [--render-url URL] [--generate-url URL] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys

import httpx
from PIL import Image


def red_png_data_url(size: int = 224) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (255, 0, 0)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


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

    model = http.get(f"{args.render_url}/v1/models").raise_for_status().json()["data"][0]["id"]
    chat = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": red_png_data_url()}},
                    {"type": "text", "text": "What color is this image?"},
                ],
            }
        ],
    }
    # 1. Render: token ids, mm_hashes, placeholders and the processed pixels.
    rendered = http.post(f"{args.render_url}/v1/chat/completions/render", json=chat)
    request = rendered.raise_for_status().json()
    image = request["features"]["mm_placeholders"]["image"][0]
    print(f"rendered: {len(request['token_ids'])} tokens, image at {image}", file=sys.stderr)

    # 2. Generate: the render output as it is, plus sampling parameters.
    request["sampling_params"] = {
        **request["sampling_params"],
        "temperature": 0.0,
        "max_tokens": args.max_tokens,
    }
    answer = http.post(f"{args.generate_url}/inference/v1/generate", json=request)
    token_ids = answer.raise_for_status().json()["choices"][0]["token_ids"]
    print(f"generated token ids: {token_ids}", file=sys.stderr)

    # 3. Decode with the model's tokenizer (a local folder here; a hub name works with a hub).
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    print(tokenizer.decode(token_ids, skip_special_tokens=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
