"""The ``medusa-lite`` subcommands other than ``generate`` (which is :mod:`medusa_lite.cli`), one module each.

Each module has a ``build_parser()`` and the function :data:`medusa_lite.cli.SUBCOMMANDS` names,
which takes the arguments and returns the exit status. ``infer/`` and ``train/`` hold thin script
entry points over them.
"""
