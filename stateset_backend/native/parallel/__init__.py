"""Data parallelism on the native engine: process groups, sharding and their settings.
"""
