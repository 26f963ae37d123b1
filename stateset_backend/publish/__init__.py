"""Stage 8, what leaves the hub: the HTML report, the MLflow export, in-toto attestations and
the JSON Schemas of the documents the hub writes.
"""
