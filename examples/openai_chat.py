"""Chat with an image (or a video, or audio) through the front door with the OpenAI SDK, whole
and streamed.

python examples/openai_chat.py [--url http://127.0.0.1:8000] [--max-tokens N]
    [--media image|video|audio]
"""

from __future__ import annotations

import argparse
import os

from media_parts import MEDIA, user_message
from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("TANDEM_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--media", choices=MEDIA, default="image", help="what the chat holds")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key=os.environ.get("TANDEM_API_KEY", "none"))
    model = client.models.list().data[0].id
    messages = [user_message(args.media)]
    answer = client.chat.completions.create(
        model=model, messages=messages, max_tokens=args.max_tokens, temperature=0.0
    )
    print("whole:   ", answer.choices[0].message.content, answer.usage)
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    print("streamed:", text)
    return 0 if text == answer.choices[0].message.content else 1


if __name__ == "__main__":
    raise SystemExit(main())
