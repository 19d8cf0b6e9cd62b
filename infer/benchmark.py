"""``python infer/benchmark.py``: the same as ``medusa-lite benchmark``, see medusa_lite/commands/benchmark.py."""

import sys

from medusa_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["benchmark", *sys.argv[1:]]))
