"""The drafter kinds medusa-lite knows, one entry each: what ``load()``, training, push and the CLI read.

A kind is a folder under ``medusa_lite/drafters/`` (its module and config, its proposer and the
cost of its proposal, its training hooks) whose ``kind.py`` fills one
:class:`~medusa_lite.drafters.contract.DrafterKind`; :func:`builtin_kinds` lists the built-in ones,
one line each. A kind defined elsewhere (a plug-in, a test) joins with :func:`register`.

Every lookup goes through this module: by the name a training config gives (``drafter:``), by the
``kind`` an artifact's ``config.json`` records, or by the artifact (or its config) in hand.
"""

from __future__ import annotations

from typing import Any

from medusa_lite.drafters.contract import DrafterKind

_REGISTERED: dict[str, DrafterKind] = {}


def builtin_kinds() -> tuple[DrafterKind, ...]:
    """The kinds medusa-lite ships. Imported here, on first use, because their training hooks import
    :mod:`medusa_lite.training`, whose config validation reads this registry."""
    from medusa_lite.drafters.hydra.kind import HYDRA_HEADS
    from medusa_lite.drafters.medusa.kind import MEDUSA_HEADS
    from medusa_lite.drafters.sequential.kind import SEQUENTIAL_DRAFTER

    return (MEDUSA_HEADS, SEQUENTIAL_DRAFTER, HYDRA_HEADS)


def registered() -> tuple[DrafterKind, ...]:
    """Every kind known now: the built-in ones, then those registered, in order."""
    if not _REGISTERED:
        for kind in builtin_kinds():
            _add(kind)
    return tuple(_REGISTERED.values())


def register(kind: DrafterKind) -> DrafterKind:
    """Make ``kind`` known to ``load()``, training, push and the CLI; its name, recorded kind and artifact
    class must be new."""
    registered()
    _add(kind)
    return kind


def unregister(name: str) -> None:
    """Forget a registered kind (the built-in ones stay)."""
    if name in {kind.name for kind in builtin_kinds()}:
        raise ValueError(f"{name!r} is a built-in drafter kind")
    registered()
    _REGISTERED.pop(name, None)


def _add(kind: DrafterKind) -> None:
    for known in _REGISTERED.values():
        clash = (
            "name"
            if known.name == kind.name
            else "recorded kind"
            if known.recorded_kind == kind.recorded_kind
            else "artifact class"
            if known.artifact is kind.artifact
            else None
        )
        if clash is not None:
            raise ValueError(f"drafter kind {kind.name!r}: its {clash} is {known.name!r}'s already")
    _REGISTERED[kind.name] = kind


def kind_names() -> tuple[str, ...]:
    """The names a training config's ``drafter:`` accepts."""
    return tuple(kind.name for kind in registered())


def kind_named(name: str) -> DrafterKind | None:
    """The kind a training config names (None: unknown)."""
    return next((kind for kind in registered() if kind.name == name), None)


def kind_recorded(recorded_kind: str | None) -> DrafterKind | None:
    """The kind of an artifact whose ``config.json`` records ``recorded_kind`` (None: unknown)."""
    return next((kind for kind in registered() if kind.recorded_kind == recorded_kind), None)


def kind_of(artifact_or_config: Any) -> DrafterKind | None:
    """The kind of an artifact module or of its config (None: neither)."""
    return next(
        (kind for kind in registered() if isinstance(artifact_or_config, (kind.artifact, kind.artifact.config_class))),
        None,
    )


def artifact_classes() -> tuple[type, ...]:
    """Every registered kind's module class."""
    return tuple(kind.artifact for kind in registered())
