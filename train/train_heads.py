"""Train Medusa heads: the ``accelerate launch`` entry point of ``medusa-lite train`` (medusa_lite.commands.train).

accelerate launch train/train_heads.py --config configs/smollm2_heads.yaml [--key value ...] [--resume]
"""

import sys

from medusa_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
