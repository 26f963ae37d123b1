"""Multi-turn rollouts on the native engine: conversations driven through the
engine-neutral environment protocol.
"""
