"""Stage 5, the plan: a reviewable, checksummed launch plan made from a spec and one engine
release, which `run` executes without re-translating.
"""
