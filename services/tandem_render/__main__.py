"""``python -m tandem_render --model DIR [--workers N] [--host H --port P | --uds PATH] ...``"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from tandem_http import (
    add_body_deadline_flags,
    add_send_deadline_flags,
    add_uds_argument,
    program_name,
    serve_settings,
    settings_from_cli,
)
from tandem_vllm.parser_flags import add_parser_flags, check_parser_flags

from .settings import SETTINGS_ENV, RenderSettings


def parse_args(argv: Sequence[str] | None = None) -> RenderSettings:
    p = argparse.ArgumentParser(prog=program_name("tandem_render"), description=__doc__)
    env = os.environ.get
    p.add_argument(
        "--model",
        default=env("TANDEM_MODEL"),
        required=env("TANDEM_MODEL") is None,
        help="model folder or hub name: tokenizer, chat template and processor configs, no "
        "weights (default: $TANDEM_MODEL)",
    )
    p.add_argument(
        "--served-model-name",
        nargs="*",
        default=[],
        help="names clients may use in `model` (default: --model)",
    )
    p.add_argument("--tokenizer", help="tokenizer folder or name, if not the model's")
    p.add_argument("--revision", help="model revision, for hub names")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run model-provided processor code (only for models you trust)",
    )
    p.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    add_parser_flags(p, RenderSettings.tool_strict_level, RenderSettings.cohere_format)
    p.add_argument(
        "--host",
        default=env("TANDEM_HOST", "127.0.0.1"),
        help="address to listen on (default: $TANDEM_HOST, else 127.0.0.1)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(env("TANDEM_RENDER_PORT", "8100")),
        help="port to listen on (default: $TANDEM_RENDER_PORT, else 8100)",
    )
    add_uds_argument(p)
    p.add_argument(
        "--workers",
        type=int,
        default=int(env("TANDEM_RENDER_WORKERS", "0")) or None,
        help="worker processes (default: $TANDEM_RENDER_WORKERS, else the usable cores but one, "
        "at least one: an engine shares the host in a one-box deployment)",
    )
    p.add_argument(
        "--inline-processing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="render on each worker's loop thread instead of thread pools (default: on)",
    )
    p.add_argument(
        "--api-key",
        nargs="+",
        default=None,  # the environment is read after parsing, so --help never shows the key
        help="require `Authorization: Bearer KEY` with one of these keys on every route but "
        "/health (default: $TANDEM_API_KEY, else no key)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn log level (default: %(default)s)")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help=f"largest request body, in bytes (default: {RenderSettings.max_body_bytes})",
    )
    p.add_argument(
        "--max-images-per-prompt",
        type=int,
        help="most images in one prompt: vLLM's --limit-mm-per-prompt for them, capped by "
        "what the model takes (default: the model's own limit, as vllm serve's)",
    )
    p.add_argument(
        "--max-videos-per-prompt",
        type=int,
        help="most videos in one prompt: vLLM's --limit-mm-per-prompt for them, capped by "
        "what the model takes (default: the model's own limit, as vllm serve's)",
    )
    p.add_argument(
        "--max-audios-per-prompt",
        type=int,
        help="most audio clips in one prompt: vLLM's --limit-mm-per-prompt for them, capped by "
        "what the model takes (default: the model's own limit, as vllm serve's)",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        help="requests a worker holds at once before answering 429 "
        f"(default: {RenderSettings.max_pending})",
    )
    p.add_argument(
        "--max-held-bytes",
        type=int,
        help="bytes of request bodies (by Content-Length) a worker's admitted requests may "
        "hold before answering 429 (default: a quarter of the memory limit, cgroup or RAM, "
        "shared by the workers; 0: no byte budget)",
    )
    add_body_deadline_flags(p)
    add_send_deadline_flags(p)
    p.add_argument(
        "--item-cache-bytes",
        type=int,
        help="bytes of encoded items kept per worker, by mm_hash "
        f"(default: {RenderSettings.item_cache_bytes})",
    )
    p.add_argument(
        "--decoded-cache-bytes",
        type=int,
        help="bytes of decoded media kept per worker, by a hash of the encoded bytes "
        f"(default: {RenderSettings.decoded_cache_bytes})",
    )
    p.add_argument(
        "--answer-cache-bytes",
        type=int,
        help="bytes of whole answers kept per worker, by the exact request bytes, for requests "
        f"whose media are inline (default: {RenderSettings.answer_cache_bytes})",
    )
    p.add_argument(
        "--answer-cache-ttl-s",
        type=float,
        help="seconds a cached answer is served; 0 disables the answer cache "
        f"(default: {RenderSettings.answer_cache_ttl_s})",
    )
    p.add_argument(
        "--mm-processor-cache-gb",
        type=float,
        help="GiB of vLLM's processor cache per worker (a repeated image skips the HF "
        f"processor); 0 disables it (default: {RenderSettings.mm_processor_cache_gb})",
    )
    p.add_argument(
        "--pretouch-cache-memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep freed memory and fault in the cache budgets at start-up (default: on)",
    )
    p.add_argument(
        "--enable-mm-embeds",
        action="store_true",
        default=None,
        help="accept precomputed image embeddings (`image_embeds` content parts as "
        "safetensors; vLLM's option of the same name); start generate with it too",
    )
    p.add_argument(
        "--answer-zstd-level",
        type=int,
        help="zstd level of binary answers to callers whose Accept-Encoding names zstd; 0 never "
        f"compresses (default: {RenderSettings.answer_zstd_level})",
    )
    p.add_argument(
        "--mm-processor-kwargs-allowlist",
        nargs="*",
        help="keys a request may set in `mm_processor_kwargs` (default: "
        f"{' '.join(RenderSettings.mm_processor_kwargs_allowlist)})",
    )
    p.add_argument(
        "--max-kwargs-pixels",
        type=int,
        help="largest min_pixels/max_pixels a request may set in mm_processor_kwargs "
        "(default: the model's own max_pixels)",
    )
    p.add_argument(
        "--max-kwargs-frames",
        type=int,
        help="largest num_frames a request may set (default: the video processor's max_frames)",
    )
    p.add_argument(
        "--allowed-media-domains",
        nargs="*",
        help="fetch http(s) media only from these domains and their subdomains "
        "(default: any domain)",
    )
    p.add_argument(
        "--allow-private-networks",
        action="store_true",
        default=None,
        help="let media URLs reach private, loopback and link-local addresses "
        "(development only; default: refused)",
    )
    p.add_argument(
        "--allowed-private-hosts",
        nargs="*",
        help="hosts or IPs exempt from the private-address block, e.g. an internal media store",
    )
    p.add_argument(
        "--allowed-local-media-path",
        help="folder file:// media may be read from (default: file:// is refused)",
    )
    p.add_argument(
        "--media-fetch-timeout-s",
        type=float,
        help="timeout of one remote media fetch, in seconds "
        f"(default: {RenderSettings.media_fetch_timeout_s})",
    )
    p.add_argument(
        "--max-media-bytes",
        type=int,
        help="largest encoded image, video or audio clip, in bytes "
        f"(default: {RenderSettings.max_media_bytes})",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        help="largest declared image (width x height), checked before decoding "
        f"(default: {RenderSettings.max_image_pixels})",
    )
    p.add_argument(
        "--max-video-seconds",
        type=float,
        help="longest video, checked from its container "
        f"(default: {RenderSettings.max_video_seconds})",
    )
    p.add_argument(
        "--max-video-frames",
        type=int,
        help=f"most frames in a video's container (default: {RenderSettings.max_video_frames})",
    )
    p.add_argument(
        "--max-decoded-video-bytes",
        type=int,
        help="most bytes of decoded frames one video may take "
        f"(default: {RenderSettings.max_decoded_video_bytes})",
    )
    p.add_argument(
        "--max-decoded-request-bytes",
        type=int,
        help="most bytes all of one request's media may decode to (RGB pixels, sampled video "
        "frames, float32 audio), checked from headers before decoding (default: the model's "
        "max_pixels x --max-images-per-prompt x 3, capped at 1 GiB, at least one image at "
        "--max-image-pixels)",
    )
    p.add_argument(
        "--max-audio-seconds",
        type=float,
        help="longest audio clip, checked from its header "
        f"(default: {RenderSettings.max_audio_seconds})",
    )
    p.add_argument(
        "--max-audio-sample-rate",
        type=int,
        help="highest audio sample rate in Hz, checked from its header "
        f"(default: {RenderSettings.max_audio_sample_rate})",
    )
    p.add_argument(
        "--max-decoded-audio-bytes",
        type=int,
        help="most bytes one audio clip may decode to (float32, every channel) "
        f"(default: {RenderSettings.max_decoded_audio_bytes})",
    )
    args = vars(p.parse_args(argv))
    args["served_model_name"] = tuple(args["served_model_name"] or ())
    args["api_key"] = args["api_key"] or env("TANDEM_API_KEY")
    check_parser_flags(p, args)
    return settings_from_cli(RenderSettings, args)


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    serve_settings("tandem_render.app:app_from_env", settings, SETTINGS_ENV)


if __name__ == "__main__":
    main()
