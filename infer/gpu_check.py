"""``python infer/gpu_check.py``: the same as ``medusa-lite gpu-check``, see medusa_lite/commands/gpu_check.py."""

import sys

from medusa_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["gpu-check", *sys.argv[1:]]))
