"""Where an artifact's files come from: a local folder or a Hub repo, decided once.

:func:`resolve_source` turns what a user typed (``runs/out/heads``, ``~/heads``,
``org/medusa-heads``) into an :class:`ArtifactSource`; :meth:`ArtifactSource.file` then gives
the local path of one file of it, downloaded into the Hub cache for a repo with the source's
``revision``, ``token`` and ``cache_dir``. Every file of an artifact (heads, ``tree.json``, the
datastore, the adapter) is found through it.

The rules:

- text naming an existing folder is that folder; an existing file is refused (a folder is meant);
- text that can only be a path (absolute; starting with ``.`` or ``~``; whose first component is an
  existing folder; or not a valid repo id) and does not exist raises :class:`ArtifactNotFoundError`
  naming the folder and, where one is close, the existing sibling the user may have meant;
- anything else is a Hub repo id. A repo that cannot be had (not in the local Hub cache while
  offline, no such repo or revision) raises :class:`ArtifactNotFoundError` saying which.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from medusa_lite.errors import ArtifactNotFoundError

# difflib's similarity a sibling folder's name needs to be offered as "did you mean".
SIMILAR_NAME_CUTOFF = 0.6


@dataclass(frozen=True)
class ArtifactSource:
    """A local folder (``folder`` set) or a Hub repo ``name`` with how to download from it."""

    name: str
    what: str
    folder: Path | None = None
    revision: str | None = None
    token: str | bool | None = None
    cache_dir: str | os.PathLike | None = None
    local_files_only: bool = False

    @property
    def is_local(self) -> bool:
        return self.folder is not None

    def file(self, file_name: str, *, required: bool = False) -> Path | None:
        """The local path of ``file_name`` (``"adapter/adapter_config.json"`` for a sub-folder's file).

        None when the artifact has no such file (or, for a repo offline, when the local Hub cache
        does not hold it); ``required=True`` raises :class:`ArtifactNotFoundError` instead.
        """
        if self.folder is not None:
            path = self.folder / file_name
            if path.is_file():
                return path
            if required:
                raise ArtifactNotFoundError(f"{self.what} folder {self.folder} has no {file_name}")
            return None
        try:
            return Path(
                hf_hub_download(
                    self.name,
                    file_name,
                    revision=self.revision,
                    cache_dir=self.cache_dir,
                    token=self.token,
                    local_files_only=self.local_files_only,
                )
            )
        except (RemoteEntryNotFoundError, LocalEntryNotFoundError) as error:
            if required:
                raise self.hub_error(file_name, error) from error
            return None
        except (HfHubHTTPError, HFValidationError, OSError) as error:
            raise self.hub_error(file_name, error) from error

    def hub_error(self, file_name: str, error: Exception) -> ArtifactNotFoundError:
        """The error that says why ``file_name`` of this repo cannot be had."""
        repo = f"Hub repo {self.name!r}" + (f" (revision {self.revision!r})" if self.revision else "")
        if isinstance(error, LocalEntryNotFoundError):
            offline = huggingface_hub.constants.HF_HUB_OFFLINE
            if offline or self.local_files_only:
                switch = "HF_HUB_OFFLINE is set" if offline else "local_files_only=True"
                cache = f" ({self.cache_dir})" if self.cache_dir else ""
                return ArtifactNotFoundError(
                    f"{self.what} {self.name!r}: not a local folder, and {file_name} of {repo} is not in the local "
                    f"Hub cache{cache} while {switch}. Download it while online (`hf download {self.name}`), or pass "
                    f"the path of a local folder{self.local_hint()}"
                )
            return ArtifactNotFoundError(
                f"{self.what} {self.name!r}: could not reach the Hub for {file_name} of {repo}, and the local Hub "
                f"cache does not hold it; check your connection{self.local_hint()}"
            )
        if isinstance(error, RevisionNotFoundError):
            return ArtifactNotFoundError(f"{self.what}: {repo} has no such revision (branch, tag or commit)")
        if isinstance(error, RepositoryNotFoundError):
            return ArtifactNotFoundError(
                f"{self.what} {self.name!r}: not a local folder, and no {repo} can be read (it does not exist, or it "
                f"is private or gated: log in with `hf auth login` or pass token=){self.local_hint()}"
            )
        if isinstance(error, RemoteEntryNotFoundError):
            return ArtifactNotFoundError(f"{self.what}: {repo} has no file {file_name}")
        return ArtifactNotFoundError(f"{self.what}: downloading {file_name} of {repo} failed: {error}")

    def local_hint(self) -> str:
        """'; did you mean the local folder X?' when a folder near the current one has a similar name."""
        similar = closest_sibling(Path(self.name).expanduser())
        return f"; did you mean the local folder {similar}?" if similar is not None else ""


def resolve_source(
    name_or_path: str | os.PathLike,
    what: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> ArtifactSource:
    """An :class:`ArtifactSource` for a local folder or a Hub repo id; ``what`` names it in errors ("Medusa heads")."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a folder path or a Hub repo id, got {type(name_or_path).__name__}")
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return ArtifactSource(text, what, folder=path)
    if path.exists():
        raise ArtifactNotFoundError(f"{what}: {text} is a file; pass the folder that holds it")
    if isinstance(name_or_path, os.PathLike) or looks_like_local_path(text):
        raise ArtifactNotFoundError(missing_folder_message(path, what))
    return ArtifactSource(
        text, what, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
    )


def looks_like_local_path(text: str) -> bool:
    """Whether ``text`` can only mean a local path (it is no Hub repo id, or its first folder exists here)."""
    if not text or os.path.isabs(text) or text.startswith((".", "~")) or "\\" in text:
        return True
    if os.sep in text and Path(text.split(os.sep)[0]).is_dir():
        return True
    try:
        validate_repo_id(text)
    except HFValidationError:
        return True
    return False


def missing_folder_message(path: Path, what: str) -> str:
    """'<what> folder X does not exist', with the deepest existing ancestor or the closest sibling."""
    message = f"{what} folder {path} does not exist"
    similar = closest_sibling(path)
    if similar is not None:
        return f"{message}; did you mean {similar}?"
    ancestor = next((parent for parent in path.absolute().parents if parent.is_dir()), None)
    if ancestor is not None and ancestor != path.absolute().parent:
        return f"{message} (nor does {path.absolute().parent}; the deepest existing folder is {ancestor})"
    return message


def closest_sibling(path: Path) -> Path | None:
    """The folder beside ``path`` whose name is closest to its name, if any is similar enough."""
    parent = path.parent if str(path.parent) else Path(".")
    if not path.name or not parent.is_dir():
        return None
    try:
        names = [entry.name for entry in parent.iterdir() if entry.is_dir()]
    except OSError:
        return None
    matches = difflib.get_close_matches(path.name, names, n=1, cutoff=SIMILAR_NAME_CUTOFF)
    return parent / matches[0] if matches else None
