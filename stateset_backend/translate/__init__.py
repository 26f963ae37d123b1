"""Stage 3, translation: the rule kit that turns each spec leaf into an engine's native
settings (or refuses it), the rules shared by every engine, override rendering, and the
effective-config view behind `explain`.
"""
