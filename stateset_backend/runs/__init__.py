"""Stage 7, runs: the runner and its attempts, the run store and index, results and their
checks, resume history, quarantine, lineage between runs, and evaluation of checkpoints.
"""
