"""``python -m medusa_lite``: the same command as ``medusa-lite`` (see :mod:`medusa_lite.cli`)."""

from medusa_lite.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
