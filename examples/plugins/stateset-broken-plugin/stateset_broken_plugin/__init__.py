"""A plugin whose import fails, as a plugin with a missing dependency does."""

raise ImportError("No module named 'some_missing_dependency'")
