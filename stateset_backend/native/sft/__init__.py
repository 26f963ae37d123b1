"""Supervised fine-tuning on the native engine: the token loss and its trainer loop.
"""
