"""stateset-backend: one RL post-training experiment, any engine, one identity.

Kept import-free so that ``stateset-backend --help`` starts fast.
"""

__version__ = "0.1.0"
