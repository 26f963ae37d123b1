"""Example engine plugin for stateset-backend."""
