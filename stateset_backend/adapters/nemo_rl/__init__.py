"""The NeMo RL adapter: its rules, launch rendering (with the launcher it ships) and
output collection.
"""
