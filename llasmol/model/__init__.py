"""Base models (bundled architecture facts, tokenizers, weights) and their LoRA adapters."""
