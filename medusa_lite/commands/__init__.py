"""The ``medusa-lite`` subcommands other than ``generate`` (which is :mod:`medusa_lite.cli`), one module each.

Each module has ``build_parser()`` and a ``command(argv) -> int`` that :func:`medusa_lite.cli.main`
dispatches to; the logic they run lives in the library modules they import.
"""
