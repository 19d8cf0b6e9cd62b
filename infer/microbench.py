"""``python infer/microbench.py``: the same as ``medusa-lite microbench``, see medusa_lite/commands/microbench.py."""

import sys

from medusa_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["microbench", *sys.argv[1:]]))
