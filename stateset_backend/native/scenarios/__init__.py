"""Bundled, generated-in-code scenarios: data, tokenizer vocabulary and reward together."""
