# Generate service: the GPU image of the vLLM release render pins (0.32.0), plus Tandem.
FROM vllm/vllm-openai:v0.32.0

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared shared
COPY services services
# vLLM and its CUDA torch come with the base image; only Tandem's own packages are added.
RUN python3 -m pip install --no-cache-dir .

EXPOSE 8200
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8200/health')"]
ENTRYPOINT ["python3", "-m", "tandem_generate"]
CMD ["--host", "0.0.0.0", "--port", "8200"]
