"""Stage 1, the experiment: the engine-neutral spec model, reading spec files, input files and
their content hashes, and the experiment digest that is a run's identity.
"""
