"""Stage 5, where the engine runs: one module per provider (a local process group, a Ray
job, a Slurm batch job, a KubeRay RayJob), each taking a filled-in launch and returning how it
ended.
"""
