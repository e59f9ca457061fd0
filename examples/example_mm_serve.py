"""Render a chat with an image (or a video, or audio), generate from the render output, decode
the tokens: plain HTTP.

The upstream flow, with no Tandem library: it works against Tandem's pair and against vLLM's own
(`vllm launch render` + `vllm serve --enable-scale-out`) alike.

    python examples/example_mm_serve.py [--render-url URL] [--generate-url URL] [--max-tokens N]
        [--media image|video|audio]
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx
from media_parts import MEDIA, user_message


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
    parser.add_argument("--media", choices=MEDIA, default="image", help="what the chat holds")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    http = httpx.Client(headers=headers, timeout=300)

    model = http.get(f"{args.render_url}/v1/models").raise_for_status().json()["data"][0]["id"]
    chat = {"model": model, "messages": [user_message(args.media)]}
    # 1. Render: token ids, mm_hashes, placeholders and the processed tensors (pixels, frames,
    #    log-mel features).
    rendered = http.post(f"{args.render_url}/v1/chat/completions/render", json=chat)
    request = rendered.raise_for_status().json()
    where = request["features"]["mm_placeholders"][args.media][0]
    print(f"rendered: {len(request['token_ids'])} tokens, {args.media} at {where}", file=sys.stderr)

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
