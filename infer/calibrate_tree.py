"""``python infer/calibrate_tree.py``: the same as ``medusa-lite calibrate``, see medusa_lite/commands/calibrate.py."""

import sys

from medusa_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["calibrate", *sys.argv[1:]]))
