"""The verl adapter: its rules, Hydra override rendering and output collection.
"""
