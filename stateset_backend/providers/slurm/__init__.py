"""The Slurm provider: an engine launch as one batch job, the way each engine documents it.

The plan holds the batch script (reviewable, checksummed); `run` submits it with
``sbatch --parsable``, follows the job until Slurm says how it ended, streams its log and maps
its end state to the hub's outcomes. Nothing of the launch is shell text: the script reads the
engine's argv and environment from NUL-separated files the provider writes beside it.
"""
