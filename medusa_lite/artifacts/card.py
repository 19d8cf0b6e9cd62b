"""What every artifact's Hub model card says alike: the library, the project, the base model's Hub id."""

from __future__ import annotations

import re

LIBRARY_NAME = "medusa-lite"
PROJECT_URL = "https://github.com/medusa-lite/medusa-lite"

# A Hub model id ("name" or "namespace/name"); anything else (a local path) is named in the card's
# text but kept out of the `base_model` metadata, which the Hub only accepts for models it hosts.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


def is_hub_model_id(name: str | None) -> bool:
    return bool(name) and _REPO_ID.match(name) is not None and ".." not in name and not name.startswith(".")
