"""A Hugging Face dataset named by its Hub address, read from the local Hugging Face cache: runs never download."""

import re
from pathlib import Path
from urllib.parse import unquote

from {{ cookiecutter.package_name }}.engine import ConfigError, MissingFileError

# A Hugging Face dataset's address, as pandas, DuckDB and the datasets library write it (huggingface_hub's
# HfFileSystem).
HUB_DATASET = re.compile(r"^hf://datasets/(?P<repo>[\w.-]+/[\w.-]+)(@(?P<revision>[^/]+))?(?P<inside>/.*)?$")


def local_path(value: str | Path, setting: str = "data.path") -> Path:
    """The local path a data setting names: ``value`` itself, or for a Hugging Face dataset's address
    ``hf://datasets/<owner>/<name>[@<revision>][/<path in it>]`` that path in the dataset's snapshot in the local
    Hugging Face cache (``HF_HOME``). Runs never download (a compute node is often offline, and a run reads what
    was there when it started): fetch a dataset once with ``hf download <owner>/<name> --repo-type dataset``
    (huggingface_hub's CLI). A revision with a slash is URL-encoded, as the Hub writes it:
    ``@refs%2Fconvert%2Fparquet``.

    Raises:
        MissingFileError: the dataset, at that revision, is not in the cache, or huggingface_hub is not installed
            (each names the command that fixes it).
        ConfigError: a path or revision that climbs out of the dataset (``..``).
    """
    match = HUB_DATASET.match(str(value))
    if match is None:
        return Path(value).expanduser()
    repo, revision, inside = match["repo"], match["revision"] and unquote(match["revision"]), match["inside"] or ""
    fetch = f"`hf download {repo} --repo-type dataset{f' --revision {revision}' if revision else ''}`"
    if ".." in Path(inside).parts or ".." in Path(revision or "").parts:  # the revision names a file under refs/
        raise ConfigError(f"{setting}: {value} climbs out of the dataset ('..'); name a path inside it")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise MissingFileError(
            f"{setting}: {value} is a Hugging Face dataset, read with huggingface_hub: `pip install huggingface_hub`, "
            f"then fetch it once: {fetch}"
        ) from None
    try:
        folder = snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True)
    except LocalEntryNotFoundError:
        raise MissingFileError(
            f"{setting}: {value} is not in the local Hugging Face cache (HF_HOME), and runs never download; fetch "
            f"it once where there is internet: {fetch}, or give its folder"
        ) from None
    return Path(folder) / inside.strip("/")
