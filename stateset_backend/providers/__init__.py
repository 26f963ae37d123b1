"""Stage 6, where the engine runs: one module per provider (a local process group, a Ray
job), each taking a filled-in launch and returning how it ended.
"""
