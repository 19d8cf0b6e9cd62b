"""medusa-lite: exact speculative decoding as a transformers custom_generate method.

    model.generate(**inputs, custom_generate=<this repo or folder>, trust_remote_code=True, ...)

decodes with the drafter of the artifact named below (or medusa_heads=<folder or repo> in the call),
token for token what model.generate gives greedily and in distribution when sampling. Written by
medusa-lite (medusa_lite/artifacts/custom_generate.py); it imports medusa_lite and runs nothing else.
"""

import medusa_lite

ARTIFACT = None  # None: the heads medusa-lite ships for its default model


def generate(model, *args, medusa_heads=None, **kwargs):
    """model.generate's arguments and return value; the target is left as it is."""
    heads = medusa_heads if medusa_heads is not None else ARTIFACT
    return medusa_lite.attach(model, heads, prepack=False, adapt=False).generate(*args, **kwargs)
