"""A GRPO training loop on the CPU: rollout through the front door -> reward -> loss -> AdamW step
-> new weights on every generate node -> the next rollout, sampled by them.

    python examples/grpo_rollout.py [--url URL] [--weight-dir DIR] [--steps N] [--n N] [--lr LR]

Prompts are token ids (never re-tokenized: what the trainer holds is what the model sees), each
with two images. Every prompt is sampled ``--n`` times with the sampled tokens' logprobs; the
reward is verifiable from the tokens alone (the fraction of completion tokens that are whole
alphabetic words), and advantages are normalized within each prompt's group, as GRPO does. The
policy is the served checkpoint itself, loaded with transformers in float32: it recomputes the
completion tokens' log-probs with the same images (the processor's pixels and the render
service's expanded prompt ids, checked equal), takes GRPO's clipped surrogate against the
rollout's logprobs (one step per rollout, no KL term, as TRL's default) and one AdamW step. The
whole state dict goes to every generate node behind the door (``update_weights`` writes one
safetensors file into ``--weight-dir``, the nodes' ``--weight-transfer-dir``, and the door fans
start/update/finish out), labelled ``step-K``. Every completion of the next rollout names that
version, every node reports it, and the greedy completion of the first prompt changes.
At the end the original weights are put back (``--keep-weights`` leaves the new ones).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

from tandem_client import TandemClient

ROOT = Path(__file__).resolve().parent.parent

QUESTIONS = [
    "Which of the two pictures is brighter?",
    "Do the two pictures share a colour?",
    "Describe the first picture, then the second.",
]
MAX_PIXELS = 224 * 224
CLIP = 0.2
"""GRPO's (PPO's) ratio clip."""


def picture(seed: int, size: int = 224) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def chat_text(processor: Any, question: str, n_images: int) -> str:
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": question}]
    text: str = processor.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return text


def batch(processor: Any) -> tuple[list[list[int]], list[list[Image.Image]]]:
    """The prompts' token ids (one placeholder per image: render expands each to the image's
    tokens) and their two images each."""
    images = [[picture(2 * i), picture(2 * i + 1)] for i in range(len(QUESTIONS))]
    prompts = [
        processor.tokenizer.encode(chat_text(processor, q, 2), add_special_tokens=False)
        for q in QUESTIONS
    ]
    return prompts, images


ROLLOUT = {"logprobs": 0, "mm_processor_kwargs": {"max_pixels": MAX_PIXELS}}
"""Every rollout's options: the sampled token's logprob (GRPO's old policy), the pixel budget
the trainer's processor uses too."""


def word_tokens(tokenizer: Any) -> frozenset[int]:
    """The reward's token set: ids that decode to one alphabetic word (with its leading space)."""
    return frozenset(i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip().isalpha())


def reward(completion: list[int], words: frozenset[int]) -> float:
    return sum(t in words for t in completion) / max(1, len(completion))


def advantages(rewards: list[float]) -> list[float]:
    """Group-normalized: (r - mean) / std within one prompt's samples (0 for a flat group)."""
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / std if std > 0 else 0.0 for r in rewards]


class Policy:
    """The trainer's copy of the served model, with the processed images of each prompt."""

    def __init__(self, model_dir: str, lr: float) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_dir)
        # float32 master weights: bf16 would round small AdamW steps away.
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.vision: list[dict[str, torch.Tensor]] = []

    def add_prompt(self, question: str, images: list[Image.Image], served_ids: list[int]) -> None:
        """Process the prompt's images as render did; its expanded ids must be the engine's."""
        enc = self.processor(
            text=[chat_text(self.processor, question, len(images))],
            images=images,
            return_tensors="pt",
            images_kwargs={"max_pixels": MAX_PIXELS},
        )
        if enc["input_ids"][0].tolist() != served_ids:
            raise SystemExit("the processor's prompt ids differ from the ones the engine saw")
        self.vision.append(
            {k: enc[k] for k in ("pixel_values", "image_grid_thw", "mm_token_type_ids")}
        )

    def logprobs(self, prompt: int, prompt_ids: list[int], completion: list[int]) -> torch.Tensor:
        """log pi(token) of each completion token, the images fed through the vision tower.

        The image features go into the prompt's placeholders only: a random model may sample
        the image token itself, which the engine treats as text (transformers' own forward
        would count it as one more image placeholder and refuse)."""
        vision, inner = self.vision[prompt], self.model.model
        ids = torch.tensor([prompt_ids + completion])
        in_prompt = torch.zeros_like(ids, dtype=torch.bool)
        in_prompt[0, : len(prompt_ids)] = True
        placeholders = in_prompt & (ids == self.model.config.image_token_id)
        features = inner.get_image_features(
            vision["pixel_values"], vision["image_grid_thw"], return_dict=True
        ).pooler_output
        embeds = inner.get_input_embeddings()(ids).masked_scatter(
            placeholders[..., None], torch.cat(features)
        )
        kinds = torch.zeros_like(ids)  # completion tokens are text
        kinds[0, : len(prompt_ids)] = vision["mm_token_type_ids"][0]
        positions, _ = inner.get_rope_index(  # M-RoPE: the images' 3-D positions, then text
            ids, mm_token_type_ids=kinds, image_grid_thw=vision["image_grid_thw"]
        )
        logits = self.model(inputs_embeds=embeds, position_ids=positions).logits[0]
        # The logits at position p predict token p + 1.
        picked = logits[len(prompt_ids) - 1 : -1].float().log_softmax(-1)
        return picked.gather(-1, torch.tensor(completion)[:, None])[:, 0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under the checkpoint's names (transformers 5 renames some on load)."""
        from transformers.core_model_loading import revert_weight_conversion

        return dict(revert_weight_conversion(self.model, dict(self.model.state_dict())))


def surrogate(policy: Policy, result: Any, advantage: list[float], n: int) -> tuple[Any, float]:
    """GRPO's clipped objective (mean over each completion's tokens, then over completions)
    against the rollout's own logprobs, and the largest |trainer - engine| logprob gap."""
    terms, gap = [], 0.0
    for k, completion in enumerate(result.completion_ids):
        if not completion:
            continue
        i = k // n
        new = policy.logprobs(i, result.prompt_ids[i], completion)
        old = torch.tensor([step[0] for step in result.logprobs[k]])
        gap = max(gap, float((new.detach() - old).abs().max()))
        ratio = (new - old).exp()
        a = advantage[k]
        terms.append(torch.min(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a).mean())
    return torch.stack(terms).mean(), gap


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("FRONT_URL", "http://127.0.0.1:8000"),
        help="the front door (render and generate routes, control routes fanned out)",
    )
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument(
        "--lr",
        type=float,
        default=2e-3,
        help="AdamW learning rate (large: one step visibly changes a random model's tokens)",
    )
    parser.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    parser.add_argument(
        "--weight-dir",
        default=os.environ.get("TANDEM_WEIGHT_DIR", str(ROOT / ".cache" / "weight-transfer")),
        help="the generate nodes' --weight-transfer-dir (this process must see it too)",
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps (updates)")
    parser.add_argument("--keep-weights", action="store_true", help="do not restore at the end")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    def node_versions() -> dict[str, str | None]:
        info = httpx.get(f"{args.url}/weight_info", headers=headers).json()
        return {n["url"]: n["weight_version"] for n in info.get("nodes", [info])}

    client = TandemClient(args.url, args.url, api_key=args.api_key, weight_dir=args.weight_dir)
    with client:
        from safetensors.torch import load_file

        model = httpx.get(f"{args.url}/v1/models", headers=headers).json()["data"][0]["id"]
        policy = Policy(model, args.lr)
        tokenizer = policy.processor.tokenizer
        words = word_tokens(tokenizer)
        original = {}
        for file in sorted(Path(model).glob("*.safetensors")):
            original.update(load_file(str(file)))
        prompts, images = batch(policy.processor)
        sent_images = [[png(im) for im in pair] for pair in images]
        rollout = {"model": model, "max_tokens": args.max_tokens, **ROLLOUT}

        def greedy() -> tuple[list[int], str | None]:
            out = client.rollout(prompts[:1], sent_images[:1], n=1, temperature=0.0, **rollout)
            return out.completion_ids[0], out.versions()[0]

        before, version = greedy()
        print(f"greedy before ({version}): {before} {tokenizer.decode(before)!r}")
        print(f"reward: fraction of completion tokens in a set of {len(words)} word tokens")
        try:
            for step in range(args.steps + 1):
                result = client.rollout(prompts, sent_images, n=args.n, temperature=1.0, **rollout)
                labels = [v or "?" for v in result.versions()]
                tally = ", ".join(
                    f"{v} ({labels.count(v)} of {len(labels)} completions)"
                    for v in sorted(set(labels))
                )
                print(f"== rollout {step}: weight version {tally}")
                if step == 0:
                    for i, question in enumerate(QUESTIONS):
                        policy.add_prompt(question, images[i], result.prompt_ids[i])
                rewards = [reward(c, words) for c in result.completion_ids]
                advantage = [
                    a
                    for i in range(len(QUESTIONS))
                    for a in advantages(rewards[i * args.n : (i + 1) * args.n])
                ]
                for i, question in enumerate(QUESTIONS):
                    group = slice(i * args.n, (i + 1) * args.n)
                    shown = ", ".join(
                        f"{r:.2f}/{a:+.2f}"
                        for r, a in zip(rewards[group], advantage[group], strict=True)
                    )
                    print(
                        f"prompt {i}: {len(prompts[i])} ids -> {len(result.prompt_ids[i])} "
                        f"with images; reward/advantage {shown}; {question!r}"
                    )
                print(f"mean reward {statistics.fmean(rewards):.3f}")
                if step == args.steps:
                    break
                if not any(advantage):
                    print("every group is flat (equal rewards): this step learns nothing")
                objective, gap = surrogate(policy, result, advantage, args.n)
                (-objective).backward()
                grad = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), float("inf"))
                policy.optimizer.step()
                policy.optimizer.zero_grad()
                with torch.no_grad():
                    after, _ = surrogate(policy, result, advantage, args.n)
                print(
                    f"trained: objective {objective.item():+.4f} -> {after.item():+.4f}, "
                    f"grad norm {grad:.3f}, max |trainer - engine| logprob {gap:.3f}"
                )
                label = f"step-{step + 1}"
                # In the checkpoint's dtypes (bf16), cast one tensor at a time as the file is
                # written: the trainer holds one bf16 copy of a tensor, never of the model.
                state = policy.state_dict()
                client.update_weights(
                    ((k, v.to(original[k].dtype)) for k, v in state.items()), version=label
                )
                nodes = node_versions()
                print(f"== updated: {len(state)} tensors -> {label} on {len(nodes)} nodes: {nodes}")
                if set(nodes.values()) != {label}:
                    raise SystemExit(f"the nodes do not all report {label}")
            now, version = greedy()
            print(f"greedy after ({version}): {now} {tokenizer.decode(now)!r}")
            print(f"greedy tokens changed: {now != before}")
        finally:
            if not args.keep_weights:
                client.update_weights(original, version="default")
                print("== original weights restored (weight version default)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
