"""Generate from a prompt with medusa-lite: the same command as ``medusa-lite`` / ``python -m medusa_lite``.

    python infer/generate.py --prompt "Why is the sky blue?" --compare
"""

from medusa_lite.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
