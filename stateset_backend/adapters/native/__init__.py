"""The adapter of the native engine: how the hub launches stateset_backend.native and
reads what it wrote.
"""
