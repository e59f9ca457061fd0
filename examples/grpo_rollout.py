"""A GRPO-style rollout batch: token-id prompts with several images each, n samples, logprobs.

    python examples/grpo_rollout.py [--render-url URL ...] [--generate-url URL ...]

Prompts are token ids (never re-tokenized: what the trainer holds is what the model sees), each
with two images; every prompt is sampled ``--n`` times with logprobs, and group-relative
advantages are computed from a toy reward, as a GRPO trainer would.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics

import numpy as np
from PIL import Image

from tandem_client import TandemClient

QUESTIONS = [
    "Which of the two pictures is brighter?",
    "Do the two pictures share a colour?",
    "Describe the first picture, then the second.",
]


def picture(seed: int, size: int = 224) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def prompt_ids(tokenizer, question: str, n_images: int) -> list[int]:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": question}]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    # One image placeholder per image; the render service expands each to the image's tokens.
    return tokenizer.encode(text, add_special_tokens=False)


def toy_reward(completion: list[int]) -> float:
    return len(set(completion)) / max(1, len(completion))  # rewards varied outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--render-url", nargs="+", default=[os.environ.get("RENDER_URL", "http://127.0.0.1:8100")]
    )
    parser.add_argument(
        "--generate-url",
        nargs="+",
        default=[os.environ.get("GENERATE_URL", "http://127.0.0.1:8200")],
    )
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    args = parser.parse_args()

    with TandemClient(args.render_url, args.generate_url, api_key=args.api_key) as client:
        import httpx
        from transformers import AutoTokenizer

        model = httpx.get(
            f"{args.render_url[0]}/v1/models",
            headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
        ).json()["data"][0]["id"]
        tokenizer = AutoTokenizer.from_pretrained(model)
        prompts = [prompt_ids(tokenizer, q, 2) for q in QUESTIONS]
        images = [[picture(2 * i), picture(2 * i + 1)] for i in range(len(prompts))]
        result = client.rollout(
            prompts,
            images,
            model=model,
            n=args.n,
            temperature=1.0,
            max_tokens=args.max_tokens,
            logprobs=1,
            seed=1234,
            mm_processor_kwargs={"max_pixels": 224 * 224},
        )

    for i, question in enumerate(QUESTIONS):
        group = result.completion_ids[i * args.n : (i + 1) * args.n]
        rewards = [toy_reward(c) for c in group]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
        advantages = [(r - mean) / std for r in rewards]
        expanded = len(result.prompt_ids[i])
        print(f"prompt {i}: {len(prompts[i])} ids -> {expanded} with images; {question!r}")
        for j, (completion, adv) in enumerate(zip(group, advantages, strict=True)):
            sampled_lp = [step[0] for step in result.logprobs[i * args.n + j]]
            print(
                f"  sample {j}: {len(completion)} tokens, sum logprob {sum(sampled_lp):7.2f}, "
                f"advantage {adv:+.2f}, text {tokenizer.decode(completion)[:40]!r}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
