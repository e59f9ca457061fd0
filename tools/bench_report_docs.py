"""The benchmark report's documents: report.md (tables, targets, where we lose) and PNG plots,
written from the raw numbers ``tools.bench_report`` collects (report.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Row = dict[str, Any]

TARGET_ELIDED = 0.38
TARGET_ZSTD_PHOTO = 0.30
TARGET_ZSTD_MS_PER_MB = 1.0
TARGET_ROLLOUT = 0.7
OURS = "ours"


def med(s: dict[str, Any] | None) -> float:
    """The median of a stat (NaN when the cell has no runs)."""
    value = (s or {}).get("median")
    return float("nan") if value is None else float(value)


def cell(s: dict[str, Any] | None, digits: int = 1) -> str:
    """``median [min-max]`` of a stat."""
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def mb(n: float) -> str:
    return f"{n / 1e6:.3f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"


# -- sections ------------------------------------------------------------------------------------


def payload_md(section: dict[str, Any], losses: list[str]) -> list[str]:
    rows = section.get("rows") or []
    if not rows:
        return []
    out = [
        "## 1. Bytes per request: one first-seen image",
        "",
        "The generate request of one image with its real prompt, in each form (MB; ratios are "
        "over upstream's JSON). Image file: PNG for noise, JPEG (quality 90) for photographs "
        "(scikit-image's `coffee`, resized; the native rows are its sample photos as shipped). "
        "Raw tensor: the processor's output (uint8 `pixel_values` + `image_grid_thw`). + zstd: "
        "the elided document at zstd level 1; + row deltas, zstd: what a compressing client "
        "sends (`qwen_vl.patch_row_delta/v1`, then zstd 1), its CPU per MB of the uncompressed "
        "document including each side's transform. Held: a repeat of an image the generate node "
        "already holds (its content id, a null entry).",
        "",
        "![payload by resolution](payload_by_resolution.png)",
        "",
    ]
    body = []
    for r in rows:
        up = r["upstream_json"]
        body.append(
            [
                f"{r['kind']} {r['image']}",
                mb(r["file_bytes"]),
                mb(r["raw_tensor_bytes"]),
                mb(up),
                f"{r['ours_json'] / up:.3f}x",
                f"{r['ours_binary'] / up:.3f}x",
                f"**{r['binary_elided'] / up:.3f}x**",
                f"{r['binary_elided_zstd'] / up:.3f}x",
                f"**{r['binary_deltas_zstd'] / up:.3f}x**",
                f"{r['held_repeat']} B",
                cell(r["deltas_zstd_compress_ms_per_mb"], 2)
                + " / "
                + cell(r["deltas_zstd_decompress_ms_per_mb"], 2),
            ]
        )
    out += table(
        [
            "image",
            "file MB",
            "raw tensor MB",
            "upstream JSON MB",
            "ours JSON",
            "ours binary",
            "+ elision",
            "+ zstd",
            "+ row deltas, zstd",
            "held repeat",
            "row deltas + zstd ms/MB render / generate",
        ],
        body,
    )
    elided = [r["binary_elided"] / r["upstream_json"] for r in rows]
    photos = [r for r in rows if r["kind"] == "photo"]
    zstd = [r["binary_deltas_zstd"] / r["upstream_json"] for r in photos]
    comp = [med(r["deltas_zstd_compress_ms_per_mb"]) for r in photos]
    dec = [med(r["deltas_zstd_decompress_ms_per_mb"]) for r in photos]
    plain_comp = [med(r["zstd_compress_ms_per_mb"]) for r in photos]
    out.append(
        f"Targets: first-seen image <= {TARGET_ELIDED}x with elision: {min(elided):.3f}-"
        f"{max(elided):.3f}x, {verdict(max(elided) <= TARGET_ELIDED)}. Photographs <= "
        f"{TARGET_ZSTD_PHOTO}x with compression (row deltas, zstd): {min(zstd):.3f}-"
        f"{max(zstd):.3f}x, {verdict(max(zstd) <= TARGET_ZSTD_PHOTO)}; at <= "
        f"{TARGET_ZSTD_MS_PER_MB} ms CPU per MB each side: render {min(comp):.2f}-{max(comp):.2f}, "
        f"generate {min(dec):.2f}-{max(dec):.2f} ms/MB, "
        f"{verdict(max(comp + dec) <= TARGET_ZSTD_MS_PER_MB)}."
    )
    out.append("")
    if max(zstd) > TARGET_ZSTD_PHOTO:
        losses.append(
            f"Compression: row deltas and zstd level 1 leave photographs at {min(zstd):.2f}-"
            f"{max(zstd):.2f}x of upstream's bytes (target {TARGET_ZSTD_PHOTO}x)."
        )
    if max(comp + dec) > TARGET_ZSTD_MS_PER_MB:
        losses.append(
            f"Compression CPU: {min(comp):.1f}-{max(comp):.1f} ms/MB on render and {min(dec):.1f}-"
            f"{max(dec):.1f} on generate (target {TARGET_ZSTD_MS_PER_MB}). zstd level 1 alone "
            f"takes {min(plain_comp):.1f}-{max(plain_comp):.1f} ms/MB to compress on this machine; "
            "the coders fast enough for 1 ms/MB (lz4, zstd's negative levels) have no entropy "
            "stage and leave pixels, deltas or not, near their size (the content-coding table)."
        )
    codecs = section.get("codecs") or []
    if codecs:
        out += ["Content codings tried on the elided binary document (`make bench-wire`):", ""]
        out += table(
            ["image", "coding", "vs upstream JSON", "compress ms/MB", "decompress ms/MB"],
            [
                [
                    str(c["image"]),
                    str(c["codec"]),
                    f"{c['bytes'] / c['upstream_json_bytes']:.3f}x",
                    f"{c['compress_ms_per_mb']:.2f}",
                    f"{c['decompress_ms_per_mb']:.2f}",
                ]
                for c in codecs
            ],
        )
    return out


def render_md(section: dict[str, Any], losses: list[str]) -> list[str]:
    rows = section.get("rows") or []
    if not rows:
        return []
    out = [
        "## 2. Render throughput",
        "",
        f"Each server alone, fresh; {section.get('image', '')}; {section.get('n')} requests per "
        "run. Distinct: a new image every request; repeated: the same request again. CPU: the "
        "server's process tree per request.",
        "",
        "![render throughput](render_throughput.png)",
        "",
    ]
    out += table(
        ["server", "images", "conc", "req/s", "p50 ms", "CPU ms/req", "other load", "errors"],
        [
            [
                r["server"],
                r["images"],
                str(r["concurrency"]),
                cell(r["req_s"]),
                cell(r["p50_ms"]),
                cell(r["cpu_ms_per_req"]),
                cell(r.get("other_load_cores"), 2),
                str(r["errors"]),
            ]
            for r in rows
        ],
    )
    out += [
        "Other load: cores busy outside the benchmark's own processes during the run (other "
        "jobs on the machine); where it is high, that cell's numbers are skewed.",
        "",
    ]
    up = {(r["images"], r["concurrency"]): r for r in rows if r["server"].startswith("upstream")}
    ratios = []
    for r in rows:
        base = up.get((r["images"], r["concurrency"]))
        if base is None or not r["server"].startswith(OURS):
            continue
        ratio = med(r["req_s"]) / med(base["req_s"])
        ratios.append(f"{r['server']}, {r['images']}, c={r['concurrency']}: {ratio:.2f}x")
        if ratio < 1:
            losses.append(
                f"Render: {r['server']} serves {ratio:.2f}x upstream's requests per second "
                f"({r['images']} images, concurrency {r['concurrency']})."
            )
    if ratios:
        out += ["Throughput over upstream's: " + "; ".join(ratios) + ".", ""]
    return out


def generate_md(section: dict[str, Any], losses: list[str]) -> list[str]:
    rows = section.get("rows") or []
    if not rows:
        return []
    sampling = section.get("sampling", {})
    out = [
        "## 3. Generate-side cost",
        "",
        "One 448x448 image per chat, render -> generate (ours: msgpack both hops; upstream: "
        f"JSON) or one monolithic chat; sampling {sampling}. API CPU: the generate-side API "
        "process alone (the engine core does the same work on every path). Render, engine and "
        "client share the 2 cores.",
        "",
    ]
    out += table(
        ["path", "conc", "req/s", "p50 ms", "p95 ms", "API CPU ms/req", "errors"],
        [
            [
                r["path"],
                str(r["concurrency"]),
                cell(r["req_s"]),
                cell(r["p50_ms"]),
                cell(r["p95_ms"]),
                cell(r["api_cpu_ms_per_req"]),
                str(r["errors"]),
            ]
            for r in rows
        ],
    )
    by = {(r["path"].split(":")[0].split(" /")[0], r["concurrency"]): r for r in rows}
    notes = []
    for c in (1, 4):
        ours = by.get(("ours", c))
        pair = by.get(("upstream pair", c))
        mono = by.get(("upstream monolithic", c))
        if not ours:
            continue
        for name, other in (("upstream pair", pair), ("monolithic", mono)):
            if not other:
                continue
            cpu = med(ours["api_cpu_ms_per_req"]) / med(other["api_cpu_ms_per_req"])
            speed = med(ours["req_s"]) / med(other["req_s"])
            notes.append(f"c={c} vs {name}: API CPU {cpu:.2f}x, throughput {speed:.2f}x")
            if speed < 1:
                losses.append(
                    f"Generate, one chat at a time (c={c}): our pair serves {speed:.2f}x the "
                    f"requests per second of upstream's {name}"
                    + (
                        " (it runs no second process on the same 2 cores)"
                        if name == "monolithic"
                        else ""
                    )
                    + "."
                )
    if notes:
        out += ["Ours over upstream's: " + "; ".join(notes) + ".", ""]
    return out


def rollout_md(section: dict[str, Any], losses: list[str]) -> list[str]:
    rows = section.get("rows") or []
    if not rows:
        return []
    shape = section.get("shape", {})
    out = [
        "## 4. RL rollout batch",
        "",
        f"{shape.get('prompts')} prompts given as token ids, {shape.get('images_per_prompt')} "
        f"noise images of {shape.get('size')}x{shape.get('size')} each, n={shape.get('n')}, "
        f"max_tokens {shape.get('max_tokens')}, temperature 1.0, logprobs 0. Fresh: new images "
        "every run; repeated: the last batch again (the client and the nodes have seen it). "
        "Bytes: request and answer bodies as on the wire. CPU: each side's API process "
        "(render and front door with their workers; not the engine core). The zstd path's "
        "images are noise, which no coder shrinks: it shows what compression costs where it "
        "cannot help (section 1 has photographs).",
        "",
        "![rollout batch](rollout.png)",
        "",
    ]
    out += table(
        ["path", "images", "wall s", "sent MB", "received MB", "CPU s by side", "<= max_tokens"],
        [
            [
                r["path"],
                r["batch"],
                cell(r["wall_s"], 2),
                cell(r["sent_mb"]),
                cell(r["received_mb"]),
                ", ".join(f"{k} {cell(v, 2)}" for k, v in r["cpu_s"].items()),
                "yes" if r["within_max_tokens"] else "NO",
            ]
            for r in rows
        ],
    )
    fresh = {r["path"]: r for r in rows if r["batch"] == "fresh"}
    ours = next((r for p, r in fresh.items() if p.startswith("ours") and "zstd" not in p), None)
    pair = next((r for p, r in fresh.items() if p.startswith("upstream pair")), None)
    if ours and pair:
        ratio = med(ours["wall_s"]) / med(pair["wall_s"])
        out += [
            f"Target: ours <= {TARGET_ROLLOUT}x the upstream pair's wall time (fresh images): "
            f"{ratio:.2f}x, {verdict(ratio <= TARGET_ROLLOUT)}; bytes sent "
            f"{med(ours['sent_mb']) / med(pair['sent_mb']):.2f}x.",
            "",
        ]
        if ratio > TARGET_ROLLOUT:
            losses.append(
                f"Rollout: tandem_client takes {ratio:.2f}x the upstream pair's wall time "
                f"(target {TARGET_ROLLOUT}x): the batch is bound by the engine on 2 shared cores."
            )
    for path, r in fresh.items():
        if ours and path != ours["path"] and med(r["wall_s"]) < med(ours["wall_s"]):
            losses.append(
                f"Rollout: {path} finishes the fresh batch in {med(r['wall_s']):.1f} s, "
                f"ours in {med(ours['wall_s']):.1f} s."
            )
    return out


def scaling_md(section: dict[str, Any], losses: list[str]) -> list[str]:
    rows = section.get("rows") or []
    if not rows:
        return []
    out = [
        "## 5. Scaling with image size and images per prompt",
        "",
        "One chat end to end (render -> generate, or the monolithic chat), noise images, "
        "greedy, max_tokens 8, one request at a time. Bytes: what the client sent (the chat, "
        "plus for a pair the render answer it posts to generate).",
        "",
        "![scaling](scaling.png)",
        "",
    ]
    out += table(
        ["path", "images", "size", "latency ms", "sent MB", "errors"],
        [
            [
                r["path"],
                str(r["images"]),
                r["size"],
                cell(r["latency_ms"], 0),
                f"{med(r['sent_bytes']) / 1e6:.2f}",
                str(len(r["errors"])),
            ]
            for r in rows
        ],
    )
    cases: dict[tuple[int, str], dict[str, Row]] = {}
    for r in rows:
        cases.setdefault((r["images"], r["size"]), {})[r["path"].split(":")[0]] = r
    for (count, size), paths in cases.items():
        ours = paths.get("ours")
        if not ours:
            continue
        for name, other in paths.items():
            if name != "ours" and med(other["latency_ms"]) < med(ours["latency_ms"]):
                losses.append(
                    f"Scaling: {count} x {size}: {name} answers in "
                    f"{med(other['latency_ms']):.0f} ms, ours in {med(ours['latency_ms']):.0f} ms."
                )
    return out


# -- plots ---------------------------------------------------------------------------------------


def plots(report: dict[str, Any], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)

    rows = report.get("payload", {}).get("rows") or []
    sized = [r for r in rows if "native" not in r["image"]]
    if sized:
        series = [
            ("image file", "file_bytes"),
            ("raw tensor", "raw_tensor_bytes"),
            ("upstream JSON", "upstream_json"),
            ("ours JSON", "ours_json"),
            ("ours binary", "ours_binary"),
            ("+ elision", "binary_elided"),
            ("+ zstd", "binary_elided_zstd"),
            ("+ row deltas, zstd", "binary_deltas_zstd"),
        ]
        kinds = sorted({r["kind"] for r in sized})
        fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.2), squeeze=False)
        for ax, kind in zip(axes[0], kinds, strict=True):
            mine = [r for r in sized if r["kind"] == kind]
            width = 0.8 / len(series)
            for i, (label, key) in enumerate(series):
                xs = [j + i * width for j in range(len(mine))]
                ax.bar(xs, [r[key] / 1e6 for r in mine], width, label=label)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(mine))])
            ax.set_xticklabels([r["size"] for r in mine])
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylabel("MB per request (log scale)")
            ax.set_title(f"one first-seen image: {kind}")
        axes[0][0].legend(fontsize=8)
        save(fig, "payload_by_resolution.png")

    rows = report.get("render", {}).get("rows") or []
    if rows:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
        for ax, images in zip(axes[0], ("distinct", "repeated"), strict=True):
            for server in dict.fromkeys(r["server"] for r in rows):
                mine = [r for r in rows if r["server"] == server and r["images"] == images]
                xs = [r["concurrency"] for r in mine]
                ys = [med(r["req_s"]) for r in mine]
                lo = [y - r["req_s"]["min"] for y, r in zip(ys, mine, strict=True)]
                hi = [r["req_s"]["max"] - y for y, r in zip(ys, mine, strict=True)]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=server)
            ax.set_xticks(list(dict.fromkeys(r["concurrency"] for r in rows)))
            ax.set_xlabel("concurrency")
            ax.set_ylabel("requests/s (median, min-max)")
            ax.set_title(f"render, {images} images")
        axes[0][0].legend(fontsize=8)
        save(fig, "render_throughput.png")

    rows = report.get("rollout", {}).get("rows") or []
    if rows:
        labels = [f"{r['path']} ({r['batch']})" for r in rows]
        fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(rows) + 1.8), squeeze=False)
        for ax, key, title in (
            (axes[0][0], "wall_s", "wall time, s"),
            (axes[0][1], "sent_mb", "bytes sent, MB"),
        ):
            ys = [med(r[key]) for r in rows]
            lo = [y - r[key]["min"] for y, r in zip(ys, rows, strict=True)]
            hi = [r[key]["max"] - y for y, r in zip(ys, rows, strict=True)]
            ax.barh(range(len(rows)), ys, xerr=[lo, hi], capsize=3)
            ax.set_yticks(range(len(rows)))
            ax.set_yticklabels(labels if key == "wall_s" else [""] * len(rows), fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel(title)
        axes[0][0].set_title("GRPO-shaped batch (median, min-max)")
        save(fig, "rollout.png")

    rows = report.get("scaling", {}).get("rows") or []
    if rows:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
        for ax, variable, xlabel in (
            (axes[0][0], "size", "image size (one image)"),
            (axes[0][1], "images", "448x448 images per prompt"),
        ):
            for path in dict.fromkeys(r["path"] for r in rows):
                mine = [r for r in rows if r["path"] == path and r["variable"] == variable]
                if variable == "images":  # one image of 448x448 is in the size series
                    one = [r for r in rows if r["path"] == path and r["size"] == "448x448"]
                    mine = one[:1] + [r for r in mine if r["images"] > 1]
                names = [str(r["size"] if variable == "size" else r["images"]) for r in mine]
                ax.plot(names, [med(r["latency_ms"]) for r in mine], marker="o", label=path)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("latency ms (median)")
        axes[0][0].legend(fontsize=8)
        axes[0][0].set_title("one chat end to end")
        save(fig, "scaling.png")
    return written


# -- the document --------------------------------------------------------------------------------


def front_door_md(section: dict[str, Any], losses: list[str]) -> list[str]:
    """The door against ``vllm serve`` (tools.bench_front_door's part (b))."""
    sides = section.get("sides") or []
    if not sides:
        return []
    loads: dict[str, str] = section.get("loads") or {}
    out = [
        "## 6. The front door against `vllm serve`",
        "",
        "OpenAI `/v1/chat/completions` through the door (render, generate, the door) and "
        "through `vllm serve`, same model and engine options, greedy, max_tokens 8, a fresh "
        "image set per request; one side alive at a time, "
        f"{section.get('rounds')} round(s), one line per round; both engines with vLLM's "
        "default OpenMP binding. CPU: ms per request at c=8, by process.",
        "",
    ]
    for key, name in loads.items():
        n = (section.get("requests") or {}).get(key, {})
        out += [f"{name} per chat ({n.get('c1')} requests at c=1, {n.get('c8')} at c=8):", ""]
        rows = []
        for s in sides:
            r = s["loads"].get(key)
            if r:
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_ms"].items())
                rows.append(
                    [
                        f"{s['side']}, round {s['round']}",
                        f"{r['c1_p50_ms']:.0f} / {r['c1_p95_ms']:.0f}",
                        f"{r['c8_req_s']:.2f}",
                        f"{r['c8_p50_ms']:.0f}",
                        f"{sum(r['cpu_ms'].values()):.1f} ({cpu})",
                        str(r["errors"]),
                    ]
                )
        out += table(
            ["side", "c=1 p50 / p95 ms", "c=8 req/s", "c=8 p50 ms", "CPU ms/req", "errors"],
            rows,
        )
    benches = [s for s in sides if s.get("bench")]
    if benches:
        out += [f"`vllm bench serve` ({section.get('bench_serve')}):", ""]
        out += table(
            ["side", "completed", "TTFT p50 ms", "TPOT p50 ms", "E2E p50 ms", "req/s"],
            [
                [
                    f"{s['side']}, round {s['round']}",
                    f"{s['bench']['completed']}/{s['bench']['num_prompts']}",
                    f"{s['bench']['median_ttft_ms']:.0f}",
                    f"{s['bench']['median_tpot_ms']:.1f}",
                    f"{s['bench']['median_e2el_ms']:.0f}",
                    f"{s['bench']['request_throughput']:.2f}",
                ]
                for s in benches
            ],
        )
    out += _engine_table(section, sides)
    targets = section.get("targets") or []
    if targets:
        out += ["Targets, on the median rounds:", ""]
        out += table(
            ["door", "ratio", "measured", "goal", ""],
            [
                [t["config"], t["what"], f"{t['measured']:.2f}x", t["goal"], verdict(t["met"])]
                for t in targets
            ],
        )
        losses += [
            f"The front door ({t['config']}): {t['what']} {t['measured']:.2f}x (goal {t['goal']})."
            for t in targets
            if not t["met"]
        ]
    for key, name in loads.items():
        out += _hop_table(section, sides, key, name)
    return out


ENGINE_COLUMNS = (
    ("worker", "worker"),
    ("of it waiting", "worker waiting"),
    ("worker's work", "worker work"),
    ("core", "core"),
    ("of it waiting", "core waiting"),
    ("core's work", "core work"),
)


def _engine_table(section: dict[str, Any], sides: list[dict[str, Any]]) -> list[str]:
    """Each engine's CPU per request, its work and vLLM's busy-wait apart, and its steps."""
    rows = []
    for s in sides:
        measured = [
            (name, (s["loads"].get(key) or {}).get("engine_ms"))
            for key, name in (section.get("loads") or {}).items()
        ]
        measured.append(("vllm bench serve", (s.get("bench") or {}).get("engine_ms")))
        for load, split in measured:
            if split:
                cells = [f"{split[key]:.1f}" for _, key in ENGINE_COLUMNS]
                rows.append(
                    [f"{s['side']}, round {s['round']}", load, *cells, f"{split['steps']:.1f}"]
                )
    if not rows:
        return []
    return [
        "The engine's CPU, ms per request (at c=8, and under `vllm bench serve`): vLLM's engine "
        "core and worker wait for each other spinning for a second after each message, so "
        "under load the worker's process fills its core; its work is its CPU less that wait "
        "(`tools/engine_split.py`). Steps: the engine steps run per request (fewer requests "
        "batched together, more steps).",
        "",
        *table(["side", "load", *[c for c, _ in ENGINE_COLUMNS], "steps"], rows),
    ]


def _hop_table(
    section: dict[str, Any], sides: list[dict[str, Any]], key: str, name: str
) -> list[str]:
    """Where one request's time goes at c=1 (the services' own histograms)."""
    present = [s for s in sides if key in s["loads"]]
    rows = []
    for hop in section.get("hops") or []:
        cells = [s["loads"][key]["hops_c1_ms"].get(hop) for s in present]
        if any(c is not None for c in cells):
            rows.append([hop, *("" if c is None else f"{c:.1f}" for c in cells)])
    if not rows:
        return []
    header = ["hop", *(f"{s['side']}, round {s['round']}" for s in present)]
    return [f"Where the time goes at c=1, {name} (mean ms per request):", "", *table(header, rows)]


def header_md(meta: dict[str, Any]) -> list[str]:
    m = meta.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items() if v)
    load = m.get("load_average_at_start") or []
    minutes = (meta.get("seconds") or 0) / 60
    runs = (meta.get("args") or {}).get("runs")
    return [
        "# Tandem: the end-to-end benchmark report",
        "",
        f"Written by `make bench` (`python -m tools.bench_report`) on {meta.get('started')} in "
        f"{minutes:.1f} minutes, commit {m.get('commit')}. Raw numbers: "
        "[report.json](report.json).",
        "",
        f"- Machine: {m.get('cpu')}, {m.get('logical_cores')} logical cores, "
        f"{m.get('memory_gib')} GiB, {m.get('os')}, Python {m.get('python')}; "
        f"load average at the start {', '.join(f'{x:.2f}' for x in load)}.",
        f"- Versions: {versions}.",
        f"- Model: {meta.get('model')}; every server on 127.0.0.1, started by the run, one "
        "engine at a time; the load generator shares the cores with the servers.",
        *(
            [
                "- Kept from earlier runs (`--update` measured the rest): "
                + "; ".join(
                    f"{part} ({k.get('started')}, commit {k.get('commit')})"
                    for part, k in kept.items()
                )
                + "."
            ]
            if (kept := meta.get("kept"))
            else []
        ),
        f"- Timed cells: median of {runs} runs, [min-max].",
        "- These VMs change speed within minutes and may share their cores with other jobs: "
        "the figures are indicative; compare within one run.",
        "",
    ]


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """report.md and the plots in ``out_dir``; returns report.md's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    losses: list[str] = []
    lines = header_md(report.get("meta", {}))
    lines += payload_md(report.get("payload", {}), losses)
    lines += render_md(report.get("render", {}), losses)
    lines += generate_md(report.get("generate", {}), losses)
    lines += rollout_md(report.get("rollout", {}), losses)
    lines += scaling_md(report.get("scaling", {}), losses)
    lines += front_door_md(report.get("front_door", {}), losses)
    lines += ["## Where we lose", ""]
    lines += [f"- {loss}" for loss in losses] or ["- Nowhere in this run."]
    lines.append("")
    failures = report.get("failures") or []
    if failures:
        lines += ["## Measurements that failed in this run", ""]
        lines += [f"- {f}" for f in failures] + [""]
    plots(report, out_dir)
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    """Rewrite report.md and the plots from a report.json (e.g. after editing this module)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", nargs="?", default="docs/bench/report.json")
    args = parser.parse_args(argv)
    path = Path(args.report)
    print(write_report(json.loads(path.read_text()), path.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
