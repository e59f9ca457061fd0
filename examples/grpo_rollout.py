"""A GRPO-style loop: rollout -> toy reward -> toy training step -> weight update -> rollout.

    python examples/grpo_rollout.py [--render-url URL ...] [--generate-url URL ...]
        [--weight-dir DIR] [--steps N]

Prompts are token ids (never re-tokenized: what the trainer holds is what the model sees), each
with two images; every prompt is sampled ``--n`` times with logprobs, and group-relative
advantages are computed from a toy reward, as a GRPO trainer would. The "training step" moves
the output projection of the model (read from its safetensors checkpoint) by seeded noise
scaled with the batch's mean advantage; the new tensor goes to every generate node through
the shared ``--weight-dir`` (the server's ``--weight-transfer-dir``; `make run` serves with
``.cache/weight-transfer``), labelled ``step-K``, and the next rollout's completions name that
version. At the end the original weights are put back (``--keep-weights`` leaves the new ones).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
from pathlib import Path

import numpy as np
from PIL import Image

from tandem_client import TandemClient

ROOT = Path(__file__).resolve().parent.parent

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


TRAINED = "lm_head.weight"
"""The one tensor the toy training step changes (a whole layer: an update may be partial)."""


def train_step(weights: dict, mean_advantage: float, step: int) -> dict:
    """A toy optimizer step on the output projection: seeded noise, scaled by the reward."""
    import torch

    head = weights[TRAINED].float()
    gen = torch.Generator().manual_seed(step)
    noise = torch.randn(head.shape, generator=gen)
    scale = head.std() * (1.0 + abs(mean_advantage))
    return {TRAINED: (head + noise * scale).to(weights[TRAINED].dtype)}


def report(tokenizer, result, questions, prompts, n: int) -> float:
    """Print each group's samples and advantages; return the batch's mean reward."""
    rewards_all = []
    for i, question in enumerate(questions):
        group = result.completion_ids[i * n : (i + 1) * n]
        rewards = [toy_reward(c) for c in group]
        rewards_all += rewards
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
        advantages = [(r - mean) / std for r in rewards]
        expanded = len(result.prompt_ids[i])
        print(f"prompt {i}: {len(prompts[i])} ids -> {expanded} with images; {question!r}")
        for j, (completion, adv) in enumerate(zip(group, advantages, strict=True)):
            sampled_lp = [step[0] for step in result.logprobs[i * n + j]]
            print(
                f"  sample {j}: {len(completion)} tokens, sum logprob {sum(sampled_lp):7.2f}, "
                f"advantage {adv:+.2f}, text {tokenizer.decode(completion)[:40]!r}"
            )
    return statistics.fmean(rewards_all)


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
    parser.add_argument(
        "--weight-dir",
        default=os.environ.get("TANDEM_WEIGHT_DIR", str(ROOT / ".cache" / "weight-transfer")),
        help="the generate nodes' --weight-transfer-dir (this process must see it too)",
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps (updates)")
    parser.add_argument("--keep-weights", action="store_true", help="do not restore at the end")
    args = parser.parse_args()

    client = TandemClient(
        args.render_url, args.generate_url, api_key=args.api_key, weight_dir=args.weight_dir
    )
    with client:
        import httpx
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        model = httpx.get(
            f"{args.render_url[0]}/v1/models",
            headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
        ).json()["data"][0]["id"]
        tokenizer = AutoTokenizer.from_pretrained(model)
        # The trainer's copy of the policy: the served checkpoint (a local model folder).
        original = {}
        for file in sorted(Path(model).glob("*.safetensors")):
            original.update(load_file(str(file)))
        weights = dict(original)
        prompts = [prompt_ids(tokenizer, q, 2) for q in QUESTIONS]
        images = [[picture(2 * i), picture(2 * i + 1)] for i in range(len(prompts))]
        try:
            for step in range(args.steps + 1):
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
                versions = sorted({v or "?" for v in result.versions()})
                print(f"== rollout {step}: weight version {', '.join(versions)}")
                mean_reward = report(tokenizer, result, QUESTIONS, prompts, args.n)
                if step == args.steps:
                    break
                update = train_step(weights, mean_reward, step + 1)
                weights.update(update)
                client.update_weights(update, version=f"step-{step + 1}")
                print(f"== trained: {', '.join(update)} -> weight version step-{step + 1}")
        finally:
            if not args.keep_weights:
                client.update_weights({TRAINED: original[TRAINED]}, version="default")
                print("== original weights restored (weight version default)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
