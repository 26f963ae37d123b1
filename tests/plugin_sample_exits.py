"""A plugin whose import calls sys.exit, as a careless command-line module does."""

import sys

sys.exit("this plugin exits at import")
