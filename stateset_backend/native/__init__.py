"""The native engine: a real torch GRPO-family trainer that runs anywhere.

Imported only when it runs (as ``python -m stateset_backend.native``), never by the CLI.
"""
