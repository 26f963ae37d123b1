"""``python -m stateset_backend.native --config CONFIG --output DIR [--resume-from CKPT]``.

The engine process the core launches. Any failure is one line on stderr and exit status 1;
the core records the run as failed and never as a success.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="stateset_backend.native")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--resume-from", type=Path)
    args = parser.parse_args()
    from .sft_trainer import trainer_for
    from .trainer import load_settings

    try:
        trainer = trainer_for(load_settings(args.config), args.output)
        if args.resume_from is not None:
            trainer.resume(args.resume_from)
        trainer.train()
    except Exception as exc:  # the process boundary: one line, non-zero exit
        print(f"native engine: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"native engine: {trainer.update_count} updates committed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
