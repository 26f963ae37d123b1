"""Stage 4, the engine interface: what an engine adapter implements (translate, render,
collect, resume), the pluggy hooks that register one, and the registry of installed engines.
"""
