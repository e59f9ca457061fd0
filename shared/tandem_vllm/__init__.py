"""tandem_vllm: the one shared package that imports vLLM; adapters used only by the services.

Every conversion between the wire and vLLM lives here:

- ``items``: wire kwargs items and placeholder ranges <-> vLLM's own types.
- ``features``: a rendered engine input -> the wire ``features``.
- ``wire_transforms``: model-aware exact wire forms of processor outputs, by processor.
- ``requests``: upstream's ``GenerateRequest`` (from its render) -> the wire request.
- ``sampling``: ``SamplingParams`` <-> the wire's ``sampling_params``; ``max_tokens`` defaults.
- ``prompts``: checked wire inputs -> the engine prompt.
- ``upstream_names``: the vLLM internals the services rely on, checked at start-up.
- ``validation``: which failures of vLLM's request models are the caller's body's.
"""
