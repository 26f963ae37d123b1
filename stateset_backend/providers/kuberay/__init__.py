"""The KubeRay provider: an engine launch as one ``RayJob`` on a Kubernetes cluster.

The plan holds the manifest of the run's first attempt (``rayjob.yaml``: reviewable,
checksummed, validated offline against KubeRay's own CRDs); ``run`` writes each attempt's
manifest into the attempt's folder on the shared volume and, when asked to apply it, applies it
with ``kubectl``, follows the RayJob until KubeRay says how it ended and maps that end state to
the hub's outcomes. Nothing of the launch is spliced unquoted: the entrypoint is the argv
shell-quoted word by word, secrets are references to Kubernetes Secrets, never values.
"""
