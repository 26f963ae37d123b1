"""``python -m stateset_backend`` is the CLI."""

from .cli import main

main()
