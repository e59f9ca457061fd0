"""tandem_vllm: the one shared package that imports vLLM; adapters used only by the services."""
