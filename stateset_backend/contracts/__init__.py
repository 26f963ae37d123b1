"""Stage 2, what each engine release can do: the shipped contract JSON, its loader, the
capability vocabulary, version ranges and dialects, and the config surfaces of each release.
"""
