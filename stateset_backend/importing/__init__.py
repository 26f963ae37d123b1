"""Meeting teams where their configs are: an engine launch they already run, read the way the
engine reads it, becomes a spec, and the spec's own plan proves what it kept.

``launch.import_file`` is the entry point; ``engines`` reads each engine's launch through the
conformance kit's readers, ``shell`` splits a script without running it, ``solve`` finds the
spec by running the adapters' rules forwards, ``fates`` says why a setting the plan does not
give back ends where it does.
"""
