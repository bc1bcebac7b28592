"""Names only (no torch): imported by the pytest plugin at collection time."""

#: Architectures with a tiny-model recipe in :mod:`selfspec.testing._models` (the runner's
#: adapters: Llama/SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3).
ARCHS: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma3")

#: Positions of the tiny models (``max_position_embeddings``): prompt + output fit in them.
POSITIONS = 1024
