"""``python -m stateset_backend`` is the CLI."""

from stateset_backend.cli import main

main()
