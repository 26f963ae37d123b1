"""PPO's critic on the native engine: the value model and its settings.
"""
