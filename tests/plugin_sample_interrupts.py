"""A plugin whose import raises KeyboardInterrupt although nobody pressed Ctrl-C."""

raise KeyboardInterrupt
