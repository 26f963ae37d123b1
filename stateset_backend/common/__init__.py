"""Shared by every stage: the error types and exit codes, strict JSON reading and atomic
writes, and terminal text. Imports nothing else of the package.
"""
