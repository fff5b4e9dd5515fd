"""Pretrained files offline: a local folder or the local Hugging Face cache, never a download during a run.

A pretrained model is named either by a folder (``save_pretrained``'s output, or a copy of a hub
snapshot) or by a Hugging Face hub id (``HuggingFaceTB/SmolLM2-135M``, ``gpt2``) that must already be
in the local cache (``HF_HOME``, default ``~/.cache/huggingface``). Fetch it once where there is
internet: ``hf download <id>`` (huggingface_hub's CLI), then copy the cache to the cluster if the
compute nodes are offline. https://huggingface.co/docs/huggingface_hub/guides/download

:func:`fingerprint` identifies a base model's weights, so a checkpoint that holds only adapters
(LoRA) can refuse to load onto another base.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
{%- if cookiecutter.task == "image-classification" %}
from typing import Any
{%- endif %}

from {{ cookiecutter.package_name }}.engine import ConfigError, MissingFileError

# The files whose bytes are a model: its config and its weights (safetensors, or PyTorch's .bin).
WEIGHT_SUFFIXES = (".safetensors", ".bin")
# Weights as a pickle: loading one can run code, so only safetensors are loaded.
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


@dataclass(frozen=True)
class Pretrained:
    """Where a pretrained model's files are: ``folder``, and the hub ``revision`` (commit) when from the cache."""

    source: str
    folder: Path
    revision: str | None


def locate(source: str, revision: str | None = None, key: str = "net.model") -> Pretrained:
    """The local folder of pretrained model ``source``: a folder, or a hub id found in the local cache.

    Args:
        source: a folder holding ``config.json``, or a Hugging Face hub id.
        revision: a branch, tag or commit of a hub id (default: the cached ``main``).
        key: the config key named in errors.

    Raises:
        MissingFileError: neither a folder nor in the local cache (names the command that fetches it).
        ConfigError: a folder without ``config.json``, or one that is code (:func:`check_data_only`).
    """
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"{key}: {path} has no config.json; give the folder that save_pretrained wrote (config.json, "
                "model.safetensors, tokenizer files) or a hub snapshot folder"
            )
        check_data_only(path, key)
        return Pretrained(source, path, None)
    if not HUB_ID.match(source):
        raise MissingFileError(f"{key}: {path} does not exist; give a model folder or a Hugging Face hub id")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(source, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        at = f" --revision {revision}" if revision else ""
        raise MissingFileError(
            f"{key}: {source} is neither a folder nor in the local Hugging Face cache (HF_HOME); runs never "
            f"download. Fetch it once where there is internet: `hf download {source}{at}`, or give its folder"
        ) from None
    # A hub snapshot's files are links into the repository's blobs/ (two folders up): inside it is inside.
    check_data_only(folder, key, root=folder.parent.parent)
    return Pretrained(source, folder, folder.name)


def check_data_only(folder: Path, key: str = "net.model", root: Path | None = None) -> None:
    """Refuse a model folder whose loading would run code from it or read anything outside it.

    Every ``from_pretrained`` of this project passes ``trust_remote_code=False`` and
    ``use_safetensors=True`` too; this names the problem in one line before transformers reads anything.
    Only regular files inside the folder are read: a symlink out of it (``root``: the hub cache's
    repository folder for a snapshot), a FIFO or a device (a read that never ends), and a weight index
    (``model.safetensors.index.json``) naming a file elsewhere are refused.

    Raises:
        ConfigError: ``config.json`` / ``tokenizer_config.json`` maps the model to Python files in the
            folder (``auto_map``) for a ``model_type`` transformers does not implement, the weights
            are pickled only (``pytorch_model.bin``, ``.pt``) with no ``.safetensors`` beside them, or
            a file is not a regular file inside the folder.
    """
    check_files_inside(folder, key, root or folder)
    try:
        from transformers.models.auto import configuration_auto

        implemented = configuration_auto.CONFIG_MAPPING_NAMES
    except ImportError:  # timm's folders without transformers: every auto_map is code to refuse
        implemented = {}

    for name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("auto_map") and config.get("model_type") not in implemented:
            raise ConfigError(
                f"{key}: {folder / name} maps model_type {config.get('model_type')!r} to Python code in the folder "
                "(auto_map), which this project never runs (trust_remote_code=False): use a model transformers "
                "implements, or load it yourself only if you trust that code"
            )
    weights = [file.name for file in folder.iterdir() if file.is_file() and file.name.endswith(WEIGHT_SUFFIXES)]
    pickled = [name for name in weights if name.endswith(PICKLED_SUFFIXES)]
    if pickled and len(pickled) == len(weights):
        raise ConfigError(
            f"{key}: {folder} holds its weights as a pickle ({', '.join(sorted(pickled)[:3])}), which can run code "
            "when loaded: only .safetensors are loaded. Convert them where you trust the file: "
            "`AutoModelForCausalLM.from_pretrained(folder).save_pretrained(new_folder)` writes model.safetensors"
        )


def check_files_inside(folder: Path, key: str, root: Path) -> None:
    """Every entry of ``folder`` is a regular file (or a folder) that resolves inside ``root``, and every
    shard a ``*.index.json`` names is one of them (see :func:`check_data_only`)."""
    inside = root.resolve()
    for entry in sorted(folder.iterdir()):
        resolved = entry.resolve()
        if not resolved.is_relative_to(inside):
            raise ConfigError(f"{key}: {entry} leads out of {folder} (to {resolved}): only its own files are read")
        if not (resolved.is_file() or resolved.is_dir()):  # a FIFO, a socket, a device
            raise ConfigError(f"{key}: {entry} is not a regular file: only the folder's own files are read")
        if resolved.is_dir() and entry.name.endswith((*WEIGHT_SUFFIXES, ".json", ".model", ".txt")):
            raise ConfigError(f"{key}: {entry} is a folder where a model file of that name is read: rename it")
    for index in sorted(folder.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            raise ConfigError(f"{key}: {index} is not a weight index (JSON with a weight_map)") from None
        for shard in sorted(str(name) for name in shards):
            if Path(shard).name != shard or not (folder / shard).is_file():
                raise ConfigError(
                    f"{key}: {index} names the weight file {shard!r}, which is not a file of {folder}: "
                    "only the folder's own files are read"
                )


def fingerprint(folder: Path) -> str:
    """SHA-256 over the names and bytes of ``config.json`` and the weight files of ``folder`` (hex).

    Reads every weight file once: about 1 s per GB on one core.
    """
    digest = hashlib.sha256()
    files = [folder / "config.json", *sorted(f for f in folder.iterdir() if f.name.endswith(WEIGHT_SUFFIXES))]
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()
{%- if cookiecutter.task == "image-classification" %}


def json_object(path: Path, where: str) -> dict[str, Any]:
    """The JSON object in ``path``, or ConfigError naming ``where`` (not JSON, or not an object)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"{where} is not readable JSON ({error}); copy the file again from the model") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where} is not a JSON object; copy the file again from the model")
    return config


def read_weights(file: Path, architecture: str, key: str = "net.weights") -> dict[str, Any]:
    """A weights file's tensors by name: ``.safetensors``, or a pickle read with ``torch.load(weights_only=True)``
    (PyTorch's restricted unpickler: tensors and plain containers only, no code runs). A checkpoint
    that nests them (``{"state_dict": ...}``, ``{"model": ...}``) is unwrapped.

    Raises:
        MissingFileError: no such file.
        ConfigError: not a weights file, or one that cannot be read without running code.
    """
    import torch

    if not file.is_file():
        raise MissingFileError(f"{key}: {file} does not exist; give the weights file of {architecture}")
    if not file.name.endswith((".safetensors", *PICKLED_SUFFIXES)):
        raise ConfigError(f"{key}: {file} is not a weights file (.safetensors, .pth, .pt, .bin)")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(file)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # safetensors' and the unpickler's errors share no base class
        raise ConfigError(
            f"{key}: {file} is not a readable weights file ({type(error).__name__}: {str(error)[:200]}); a pickle "
            "that needs code to load is refused: save its state_dict as .safetensors where you trust it"
        ) from None
    for nested in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(nested), dict):
            state = state[nested]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{key}: {file} holds no tensors by name (a state_dict); give {architecture}'s weights")
    return state


def load_all_weights(
    model: Any, state: dict[str, Any], file: Path, architecture: str, key: str = "net.weights"
) -> None:
    """Load ``state`` into ``model``, every weight of each or an error: never a half-loaded backbone.

    ``model.load_state_dict(strict=False)`` (what timm's own loader falls back to when the classifier
    differs) would load a file of another model as nothing at all, with a log line at most.

    Raises:
        ConfigError: weights missing from the file, weights the model lacks, or shapes that differ.
    """
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # shapes that differ
        raise ConfigError(f"{key}: {file} does not fit {architecture}: {str(error)[:300]}") from None
    if missing or unexpected:
        raise ConfigError(
            f"{key}: {file} is not {architecture}'s: {len(missing)} of its weights are missing "
            f"({', '.join(missing[:3])}) and {len(unexpected)} unknown ({', '.join(unexpected[:3])})"
        )
{%- endif %}
