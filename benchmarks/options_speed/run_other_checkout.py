"""Run a script against the medusa_lite of another checkout (the editable install's finder set aside).

python benchmarks/options_speed/run_other_checkout.py CHECKOUT SCRIPT [ARGS...]
"""

import runpy
import sys

checkout, script, *args = sys.argv[1:]
sys.meta_path = [
    f for f in sys.meta_path if "editable" not in (getattr(f, "__module__", "") + type(f).__name__).lower()
]
sys.path.insert(0, checkout)
sys.argv = [script, *args]
import medusa_lite  # noqa: E402

assert medusa_lite.__file__.startswith(checkout), medusa_lite.__file__
print("medusa_lite from", medusa_lite.__file__, file=sys.stderr)
runpy.run_path(script, run_name="__main__")
