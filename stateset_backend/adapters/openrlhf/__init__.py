"""The OpenRLHF adapter: its rules, argv rendering and output collection.
"""
