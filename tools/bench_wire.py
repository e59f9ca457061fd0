"""Wire codec micro-benchmark: ours (JSON, binary, binary with wire transforms) against vLLM's
own serde and a memory copy, and the bytes each puts on the wire.

Run with `make bench-wire`. Items are the real processor outputs of the tiny Qwen2-VL model for
a 448x448 and a 1024x768 random-noise image. Each case is encode + decode of one item until it
is a vLLM ``MultiModalKwargsItem`` again; throughput counts the item's tensor bytes. Documents
carry the image's real prompt (its token ids and placeholder range).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    import torch
    from vllm.multimodal.inputs import MultiModalKwargsItem

    from tandem_vllm.wire_transforms import WireTransforms

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Case:
    name: str
    encode: Callable[[], object]
    decode: Callable[[object], object]


@dataclass
class Sample:
    """One image's processor output and the prompt it was rendered into."""

    item: MultiModalKwargsItem
    token_ids: list[int]
    offset: int
    length: int
    transforms: WireTransforms


class Processor:
    """vLLM's processor for a tiny model, in-process, turning images into samples."""

    def __init__(self, model: str) -> None:
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.renderers.chat_utils import ChatCompletionMessageParam

        from tandem_vllm.wire_transforms import wire_transforms_for
        from tools.tiny_models import ensure_model

        path = ensure_model(model)
        self.proc = MULTIMODAL_REGISTRY.create_processor(
            ModelConfig(model=str(path), max_model_len=4096)
        )
        self.transforms = wire_transforms_for(self.proc.info.get_hf_processor())
        tok = self.proc.info.get_tokenizer()
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}
        ]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(text, str)  # tokenize=False
        self.ids = tok.encode(text, add_special_tokens=False)

    def sample(self, image: Image.Image) -> Sample:
        from vllm.multimodal.processing import ProcessorInputs, TimingContext

        out = self.proc.apply(
            ProcessorInputs(self.ids, self.proc.info.parse_mm_data({"image": [image]})),
            TimingContext(enabled=False),
        )
        item = out["mm_kwargs"]["image"][0]
        assert item is not None  # the processor ran, so the item is present
        (ph,) = out["mm_placeholders"]["image"]
        return Sample(item, list(out["prompt_token_ids"]), ph.offset, ph.length, self.transforms)


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
"""scikit-image's sample photographs (shipped in its package): 512x512, 600x400, 451x300,
640x427."""


def photo(name: str, size: tuple[int, int] | None = None) -> Image.Image:
    """A real photograph from scikit-image's package, resized (bicubic) to ``size`` if given."""
    import skimage.data

    image = Image.fromarray(getattr(skimage.data, name)())
    return image if size is None else image.resize(size, Image.Resampling.BICUBIC)


def processor_items(model: str) -> dict[str, Sample]:
    proc = Processor(model)
    return {f"{w}x{h}": proc.sample(noise(w, h)) for w, h in ((448, 448), (1024, 768))}


def cases(sample: Sample) -> list[Case]:
    import pybase64
    from vllm.entrypoints.scale_out.token_in_token_out import mm_serde
    from vllm.multimodal.inputs import MultiModalKwargsItem
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from tandem_vllm.items import item_from_vllm, item_to_vllm
    from tandem_wire import (
        GenerateRequest,
        MultiModalFeatures,
        PlaceholderRange,
        WireFormat,
        decode_generate_request,
        decode_item,
        encode_generate_request,
        encode_item,
    )

    item, transforms = sample.item, sample.transforms
    elision = transforms.accepted(frozenset({"*"}))  # what an uncompressing caller takes
    deltas = transforms.accepted(frozenset({"*"}), coded=True)  # and a compressing one
    raw_enc = MsgpackEncoder(size_threshold=2**62)
    raw_dec = MsgpackDecoder(t=MultiModalKwargsItem)

    def transformed_item(names: frozenset[str]) -> bytes:
        return encode_item(transforms.encode_item(item_from_vllm(item), names))

    def item_back(entry: object, names: frozenset[str]) -> object:
        wire = decode_item(entry)  # type: ignore[arg-type]
        return item_to_vllm(transforms.decode_item(wire)[0] if names else wire)

    def doc(fmt: WireFormat, names: frozenset[str] = frozenset(), suffix: str = "") -> Case:
        def enc() -> bytes:
            data = transformed_item(names)
            req = GenerateRequest(
                token_ids=sample.token_ids,
                features=MultiModalFeatures(
                    mm_hashes={"image": ["0" * 64]},
                    mm_placeholders={
                        "image": [PlaceholderRange(offset=sample.offset, length=sample.length)]
                    },
                    kwargs_data={"image": [data]},
                ),
            )
            return encode_generate_request(req, fmt)

        def dec(body: object) -> object:
            req = decode_generate_request(body, fmt)  # type: ignore[arg-type]
            feats = req.features
            entry = feats.kwargs_data["image"][0] if feats and feats.kwargs_data else None
            if entry is None:
                raise ValueError("the benchmark document lost its item")
            return item_back(entry, names)

        return Case(f"ours {fmt.name.lower()} document{suffix}", enc, dec)

    def upstream_doc() -> Case:
        from vllm.entrypoints.scale_out.token_in_token_out.mm_features import (
            mm_kwargs_from_features,
        )
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
            GenerateRequest as UpstreamRequest,
        )
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
            MultiModalFeatures as UpstreamFeatures,
        )
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
            PlaceholderRangeInfo,
        )
        from vllm.sampling_params import SamplingParams

        def enc() -> bytes:
            req = UpstreamRequest(
                token_ids=sample.token_ids,
                features=UpstreamFeatures(
                    mm_hashes={"image": ["0" * 64]},
                    mm_placeholders={
                        "image": [PlaceholderRangeInfo(offset=sample.offset, length=sample.length)]
                    },
                    kwargs_data={"image": [mm_serde.encode_mm_kwargs_item(item)]},
                ),
                sampling_params=SamplingParams(),
            )
            return req.model_dump_json().encode()

        def dec(body: object) -> object:
            req = UpstreamRequest.model_validate_json(body)  # type: ignore[arg-type]
            return mm_kwargs_from_features(req.features)["image"][0]  # type: ignore[arg-type]

        return Case(DOC_BASELINE, enc, dec)

    return [
        Case(
            "memcpy of the tensor bytes",
            lambda: [np.array(t.numpy(), copy=True) for t in _tensors(item)],
            lambda x: x,
        ),
        Case(
            ITEM_BASELINE,
            lambda: mm_serde.encode_mm_kwargs_item(item),
            lambda s: mm_serde.decode_mm_kwargs_item(s),  # type: ignore[arg-type]
        ),
        Case(
            "vLLM serde, raw msgpack (no base64)",
            # zmq.Frame (one member of the result union) has the buffer protocol; its stub lacks it.
            lambda: bytes(raw_enc.encode(item)[0]),  # type: ignore[arg-type]
            lambda b: raw_dec.decode(b),  # type: ignore[arg-type]
        ),
        Case(
            "ours json (base64 msgpack)",
            lambda: pybase64.b64encode(encode_item(item_from_vllm(item))).decode("ascii"),
            lambda s: item_to_vllm(decode_item(pybase64.b64decode(s, validate=True))),  # type: ignore[arg-type]
        ),
        Case(
            "ours binary (raw msgpack)",
            lambda: encode_item(item_from_vllm(item)),
            lambda b: item_to_vllm(decode_item(b)),  # type: ignore[arg-type]
        ),
        Case(
            "ours binary, elided (raw msgpack)",
            lambda: transformed_item(elision),
            lambda b: item_back(b, elision),
        ),
        upstream_doc(),
        doc(WireFormat.JSON),
        doc(WireFormat.MSGPACK),
        doc(WireFormat.MSGPACK, elision, ", elided"),
        doc(WireFormat.MSGPACK, deltas, ", row deltas"),
    ]


ITEM_BASELINE = "vLLM serde (base64 msgpack)"
DOC_BASELINE = "vLLM json document (pydantic)"


def _tensors(item: MultiModalKwargsItem) -> list[torch.Tensor]:
    import torch

    out = []
    for elem in item.values():
        assert isinstance(elem.data, torch.Tensor), type(elem.data)
        out.append(elem.data)
    return out


def measure(all_cases: list[Case], reps: int) -> list[tuple[float, float, object]]:
    """Median encode and decode ms per case, the cases interleaved round by round so that
    every case sees the same allocator and cache state."""
    encoded = [c.encode() for c in all_cases]
    for c, e in zip(all_cases, encoded, strict=True):
        c.decode(e)  # warm-up
    enc: list[list[int]] = [[] for _ in all_cases]
    dec: list[list[int]] = [[] for _ in all_cases]
    for _ in range(reps):
        for i, c in enumerate(all_cases):
            t0 = time.perf_counter_ns()
            e = c.encode()
            t1 = time.perf_counter_ns()
            c.decode(e)
            t2 = time.perf_counter_ns()
            enc[i].append(t1 - t0)
            dec[i].append(t2 - t1)
            del e
    return [
        (statistics.median(a) / 1e6, statistics.median(b) / 1e6, e)
        for a, b, e in zip(enc, dec, encoded, strict=True)
    ]


ROW = "{:<9} {:<36} {:>10} {:>8} {:>8} {:>8} {:>8}"


@dataclass
class Codec:
    name: str
    compress: Callable[[bytes], bytes]
    decompress: Callable[[bytes, int], bytes]


CHOSEN = "zstd 1 (ours)"


def codecs() -> list[Codec]:
    """The candidates for the binary bodies' content coding; zstd through our own functions
    (tandem_wire.content_coding, the bounded decoder included)."""
    import lz4.frame  # type: ignore[import-untyped]

    from tandem_wire import ZSTD, compress_zstd, decode_body

    def zstd(level: int, name: str) -> Codec:
        return Codec(name, lambda b: compress_zstd(b, level), lambda b, n: decode_body(b, ZSTD, n))

    return [
        Codec("lz4 (frame, default)", lz4.frame.compress, lambda b, n: lz4.frame.decompress(b)),
        zstd(-1, "zstd -1"),
        zstd(1, CHOSEN),
        zstd(3, "zstd 3"),
    ]


def cpu_ms(fn: Callable[[], object], reps: int) -> tuple[float, object]:
    """Median CPU time of this thread per call (ms), and the last result."""
    times = []
    out: object = None
    for _ in range(reps):
        t0 = time.thread_time_ns()
        out = fn()
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / 1e6, out


def documents(sample: Sample) -> dict[str, bytes]:
    """One first-seen image's generate document in every form it can take on the wire."""
    by_name = {c.name: c.encode() for c in cases(sample) if "document" in c.name}
    return {
        "upstream JSON": _bytes(by_name[DOC_BASELINE]),
        "ours JSON": _bytes(by_name["ours json document"]),
        "ours binary": _bytes(by_name["ours msgpack document"]),
        "binary + elision": _bytes(by_name["ours msgpack document, elided"]),
        "binary + row deltas": _bytes(by_name["ours msgpack document, row deltas"]),
    }


def _bytes(encoded: object) -> bytes:
    assert isinstance(encoded, bytes), type(encoded)
    return encoded


def codec_rows(proc: Processor, reps: int) -> list[dict[str, object]]:
    """Each codec on each photograph's (and noise's) elided binary document: size, and CPU per
    MB of the document to compress and to decompress."""
    images = {name: photo(name) for name in PHOTOS}
    images["coffee 1920x1080"] = photo("coffee", (1920, 1080))
    images["noise 448x448"] = noise(448, 448)
    rows: list[dict[str, object]] = []
    for label, image in images.items():
        sample = proc.sample(image)
        docs = documents(sample)
        body = docs["binary + elision"]
        mb = len(body) / 1e6
        for codec in codecs():
            enc_ms, packed = cpu_ms(functools.partial(codec.compress, body), reps)
            assert isinstance(packed, bytes)
            dec_ms, back = cpu_ms(functools.partial(codec.decompress, packed, len(body)), reps)
            assert back == body
            rows.append(
                {
                    "image": label,
                    "codec": codec.name,
                    "plain_bytes": len(body),
                    "bytes": len(packed),
                    "upstream_json_bytes": len(docs["upstream JSON"]),
                    "compress_ms_per_mb": enc_ms / mb,
                    "decompress_ms_per_mb": dec_ms / mb,
                }
            )
        rows.append(_row_delta_row(label, sample, docs, reps))
    return rows


@dataclass
class RowDeltaCoding:
    """A row-delta document under zstd 1, as a compressing client sends it, and each side's
    whole work on it: render's delta encode (elision included) and compress, generate's
    decompress and delta decode."""

    plain: bytes
    packed: bytes
    compress: Callable[[], object]
    decompress: Callable[[], object]


def row_delta_coding(sample: Sample, docs: dict[str, bytes]) -> RowDeltaCoding:
    from tandem_vllm.items import item_from_vllm
    from tandem_vllm.wire_transforms import PatchRowDelta
    from tandem_wire import ZSTD, compress_zstd, decode_body

    body = docs["binary + row deltas"]
    pixels = np.asarray(item_from_vllm(sample.item)["pixel_values"].data)
    (delta,) = (t for t in sample.transforms.by_key["pixel_values"] if isinstance(t, PatchRowDelta))
    encoded = delta.encode(pixels)
    assert encoded is not None  # Qwen-VL still images are uint8 patches
    sent, params = encoded
    packed = compress_zstd(body, 1)
    assert delta.decode(sent, params).tobytes() == pixels.tobytes()
    return RowDeltaCoding(
        body,
        packed,
        lambda: (delta.encode(pixels), compress_zstd(body, 1)),
        lambda: (decode_body(packed, ZSTD, len(body)), delta.decode(sent, params)),
    )


def _row_delta_row(
    label: str, sample: Sample, docs: dict[str, bytes], reps: int
) -> dict[str, object]:
    coding = row_delta_coding(sample, docs)
    enc_ms, _ = cpu_ms(coding.compress, reps)
    dec_ms, _ = cpu_ms(coding.decompress, reps)
    mb = len(coding.plain) / 1e6
    return {
        "image": label,
        "codec": ROW_DELTAS,
        "plain_bytes": len(coding.plain),
        "bytes": len(coding.packed),
        "upstream_json_bytes": len(docs["upstream JSON"]),
        "compress_ms_per_mb": enc_ms / mb,
        "decompress_ms_per_mb": dec_ms / mb,
    }


ROW_DELTAS = "row deltas + zstd 1 (ours, compressing)"


def print_codecs(rows: list[dict[str, object]]) -> None:
    row = "{:<17} {:<30} {:>10} {:>8} {:>9} {:>10} {:>10}"
    header = row.format("image", "coding", "bytes", "ratio", "vs JSON", "comp ms/MB", "dec ms/MB")
    print(header)
    print("-" * len(header))
    for r in rows:
        plain, size, json_size = (
            int(str(r[k])) for k in ("plain_bytes", "bytes", "upstream_json_bytes")
        )
        print(
            row.format(
                str(r["image"]),
                str(r["codec"]),
                size,
                f"{size / plain:.3f}x",
                f"{size / json_size:.3f}x",
                f"{r['compress_ms_per_mb']:.2f}",
                f"{r['decompress_ms_per_mb']:.2f}",
            )
        )
    print(
        "\nbytes: the elided binary document of one first-seen image, compressed; ratio: over the"
        "\nuncompressed elided document; vs JSON: over upstream's JSON document of the same image"
        "\n(target <= 0.30x on real photographs). ms/MB: CPU of the calling thread per MB of the"
        "\nuncompressed document (target <= 1 ms/MB each side), median of the runs. The row-delta"
        "\nrow is what a compressing client sends (qwen_vl.patch_row_delta/v1, then zstd 1); its"
        "\nCPU includes each side's transform (render's delta encode, generate's decode)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="qwen2-vl")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--codec-reps", type=int, default=15, help="runs per content coding")
    parser.add_argument(
        "--parts",
        default="codec,coding,hostile",
        help="codec (throughput), coding (zstd vs lz4), hostile (crafted zstd bodies)",
    )
    parser.add_argument("--json", help="also write the content-coding rows here")
    args = parser.parse_args(argv)
    # vLLM's decoder warns on every read-only buffer it wraps; the table is what matters here.
    warnings.filterwarnings("ignore", category=UserWarning)
    parts = set(args.parts.split(","))
    if "codec" in parts:
        throughput(args.model, args.reps)
    if "coding" in parts:
        print(f"\ncontent coding of a first-seen image (tiny {args.model}; CPU per run, median)\n")
        rows = codec_rows(Processor(args.model), args.codec_reps)
        print_codecs(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    if "hostile" in parts:
        hostile_bodies()
    return 0


def hostile_bodies(length: int = 32 * 1024 * 1024, cap: int = 8 * 1024 * 1024) -> None:
    """CPU to answer each crafted zstd body (``tests.support.zstd_bodies``) of ``length`` bytes
    under a ``cap``-byte limit: libzstd walks their blocks and frames (a walk of the block
    headers in Python took 3-6 s a body)."""
    from tandem_wire import ZSTD, MalformedBody, PayloadTooLarge, decode_body
    from tests.support.zstd_bodies import CRAFTED

    def answer(body: bytes) -> str:
        try:
            return f"{len(decode_body(body, ZSTD, cap))} bytes"
        except (MalformedBody, PayloadTooLarge) as exc:
            return exc.type

    print(f"\ncrafted zstd bodies of {length >> 20} MiB, cap {cap >> 20} MiB (CPU per body)\n")
    print("| body | answer | ms |\n| --- | --- | ---: |")
    for name, build in sorted(CRAFTED.items()):
        ms, got = cpu_ms(functools.partial(answer, build(length)), 5)
        print(f"| {name} | {got} | {ms:.1f} |")


def throughput(model: str, reps: int) -> None:
    """Encode + decode throughput of one item (and one document) per serialisation."""
    items = processor_items(model)
    print(f"model: tiny {model}; median of {reps} interleaved runs; one process\n")
    sizes: dict[str, dict[str, int]] = {}
    header = ROW.format("image", "case", "bytes", "enc ms", "dec ms", "MB/s", "vs vLLM")
    print(header)
    print("-" * len(header))
    for label, sample in items.items():
        item = sample.item
        payload = sum(t.nbytes for t in _tensors(item))
        shapes = ", ".join(
            f"{k} {tuple(t.shape)} {t.dtype}" for k, t in zip(item, _tensors(item), strict=True)
        )
        all_cases = cases(sample)
        gc.collect()
        results = measure(all_cases, reps)
        totals = {c.name: e + d for c, (e, d, _) in zip(all_cases, results, strict=True)}
        for case, (enc_ms, dec_ms, encoded) in zip(all_cases, results, strict=True):
            total = enc_ms + dec_ms
            mbps = payload / 1e6 / (total / 1e3)
            size = len(encoded) if isinstance(encoded, (bytes, str)) else payload
            if "document" in case.name:
                sizes.setdefault(label, {})[case.name] = size
            ref = totals[ITEM_BASELINE if "document" not in case.name else DOC_BASELINE]
            ratio = "" if case.name.startswith("memcpy") else f"{ref / total:.2f}x"
            print(
                ROW.format(
                    label, case.name, size, f"{enc_ms:.3f}", f"{dec_ms:.3f}", f"{mbps:.0f}", ratio
                )
            )
        print(f"{'':<9} ({shapes}; {payload} tensor bytes)\n")
    print(f"vs vLLM: item rows against '{ITEM_BASELINE}', document rows against")
    print(f"'{DOC_BASELINE}'; higher is faster. Ours decodes zero-copy (read-only views of")
    print("the body); vLLM's decoder copies inline tensors. MB/s: tensor bytes per encode+decode.")
    print("Elided: the model's wire transforms (tandem_vllm.wire_transforms), undone on decode.\n")
    print_sizes(sizes)


def print_sizes(sizes: dict[str, dict[str, int]]) -> None:
    """Bytes of one first-seen image's generate document, against upstream's JSON."""
    row = "{:<9} {:<36} {:>10} {:>9}"
    header = row.format("image", "document", "bytes", "vs JSON")
    print(header)
    print("-" * len(header))
    for label, by_case in sizes.items():
        base = by_case[DOC_BASELINE]
        for name, size in by_case.items():
            print(row.format(label, name, size, f"{size / base:.3f}x"))
    print("\nvs JSON: bytes over upstream's JSON document (vLLM's pydantic) for the same image.")


if __name__ == "__main__":
    raise SystemExit(main())
