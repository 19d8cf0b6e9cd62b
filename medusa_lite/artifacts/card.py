"""What every artifact's Hub model card says alike: the library, the project, the base model's Hub id."""

from __future__ import annotations

import re
from collections.abc import Sequence

LIBRARY_NAME = "medusa-lite"
PROJECT_URL = "https://github.com/medusa-lite/medusa-lite"

# A Hub model id ("name" or "namespace/name"); anything else (a local path) is named in the card's
# text but kept out of the `base_model` metadata, which the Hub only accepts for models it hosts.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


# The training summary's figures a drafter's card lists (Medusa heads' cards say more: drafters/medusa/card.py).
CARD_SUMMARY_KEYS = ("top1_accuracy", "chain_top1_accuracy", "data_records", "steps")


def drafter_card(tags: Sequence[str], title: str, description: str, facts: Sequence[str], summary: dict) -> str:
    """A drafter's model card: its metadata (the library, ``tags``), ``title``, ``description``, its ``facts``
    (one line each) and the training summary's headline figures."""
    lines = ["---", f"library_name: {LIBRARY_NAME}", f"tags: [{', '.join(tags)}]", "---", f"# {title}", ""]
    lines += [description, "", *(f"- {fact}" for fact in facts)]
    lines += [f"- {key}: {summary[key]}" for key in CARD_SUMMARY_KEYS if key in summary]
    return "\n".join(lines) + "\n"


def is_hub_model_id(name: str | None) -> bool:
    return bool(name) and _REPO_ID.match(name) is not None and ".." not in name and not name.startswith(".")
