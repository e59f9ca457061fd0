"""tandem_front: one OpenAI- and vLLM-compatible URL over the render and generate tiers."""
