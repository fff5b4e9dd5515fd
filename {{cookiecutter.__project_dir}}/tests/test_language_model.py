"""The language model: the GPT, byte windows and splits, your own text, generation, bad input."""

import gzip
import json
import logging
import math
import re
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from conftest import (
    CONFIGS,
    assert_ddp_run_resumes_exactly,
{%- if cookiecutter.use_prepared == "yes" %}
    assert_prepared_run_resumes_as_in_memory,
{%- endif %}
    assert_run_resumes_exactly,
    cached_snapshot,
{%- if cookiecutter.use_serving != "yes" %}
    greedy_completions,
{%- endif %}
    shrunk_args,
    user_error,
)
from torch.utils.data import default_collate

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.generate import main as generate_main
from {{ cookiecutter.package_name }}.commands.predict import main as predict_main
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.commands.prepare import main as prepare_main
{%- endif %}
from {{ cookiecutter.package_name }}.data import PromptCompletionDataModule, TextDataModule
from {{ cookiecutter.package_name }}.data.text import TokenWindows, checked_text_files, read_text
from {{ cookiecutter.package_name }}.engine import datamodule
from {{ cookiecutter.package_name }}.engine.callbacks import StopOnNonFinite
from {{ cookiecutter.package_name }}.engine.datamodule import whole_batch
from {{ cookiecutter.package_name }}.engine.errors import DataError
from {{ cookiecutter.package_name }}.engine.inference import load_trained
from {{ cookiecutter.package_name }}.models import LanguageModel
from {{ cookiecutter.package_name }}.models.language_model import BitsPerByte, Perplexity, decode, greedy
from {{ cookiecutter.package_name }}.nets import GPT

EXPERIMENT = CONFIGS / "experiments" / "text-folder.yaml"


def small_gpt(**overrides) -> GPT:
    settings = {"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16, "dropout": 0.0} | overrides
    return GPT(**settings)


def test_gpt_is_causal_and_ties_its_output_to_the_embedding() -> None:
    torch.manual_seed(0)
    net = small_gpt().eval()
    tokens = torch.randint(0, 256, (2, 16))
    logits = net(tokens)
    assert logits.shape == (2, 16, 256)  # (B, T, V)
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    # Positions before 10 cannot see position 10: their logits are bit-for-bit the same.
    assert torch.equal(net(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(net(changed)[:, 10:], logits[:, 10:])
    assert net.head.weight is net.token_embedding.weight


def test_activation_checkpointing_gives_the_same_loss_and_gradients() -> None:
    tokens = torch.randint(0, 256, (3, 16))
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        net = small_gpt(activation_checkpointing=checkpointing)
        loss = net(tokens).logsumexp(-1).mean()
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in net.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.allclose(loss_a, loss_b)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_b, strict=True))


def fed_lengths(net: torch.nn.Module) -> list[int]:
    """The number of tokens (T of (B, T)) of each call of ``net``, recorded from now on."""
    lengths: list[int] = []
    net.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    return lengths


def assert_cached_decoding_equals_uncached(net: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> None:
    """Greedy decoding with the key/value cache picks the same tokens as without, feeding one token a step
    until the sequence outgrows the context, then the whole window (the positions shift)."""
    block_size, prompt_length = net.block_size, prompt.shape[1]
    lengths = fed_lengths(net)
    uncached = decode(net, prompt, new_tokens, greedy, use_cache=False)
    assert set(lengths) == {min(prompt_length + step, block_size) for step in range(new_tokens)}
    lengths.clear()
    cached = decode(net, prompt, new_tokens, greedy)
    assert torch.equal(cached, uncached) and cached.shape == (prompt.shape[0], new_tokens)
    fits = block_size - prompt_length + 1  # steps whose sequence fits the context: the cache grows
    assert lengths == [prompt_length] + [1] * (fits - 1) + [block_size] * (new_tokens - fits)


def test_cached_generation_equals_uncached_and_feeds_one_token_a_step() -> None:
    torch.manual_seed(0)
    net = small_gpt(n_embd=32, block_size=24).eval()
    with torch.no_grad():
        net.token_embedding.weight.mul_(20)  # spread the logits: no near-ties for rounding to flip
        assert_cached_decoding_equals_uncached(net, torch.randint(0, 256, (2, 5)), new_tokens=30)  # past the context
        # The cached logits are the full forward pass's, position for position.
        sequence = torch.randint(0, 256, (2, 24))
        cache = net.new_cache(2)
        chunks = [net(sequence[:, :7], cache), *(net(sequence[:, t : t + 1], cache) for t in range(7, 24))]
        torch.testing.assert_close(torch.cat(chunks, dim=1), net(sequence), rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="a sequence of 25 tokens is longer than the model's block_size 24"):
            net(sequence[:, :1], cache)


def test_gpt_refuses_bad_sizes_and_long_sequences() -> None:
    with pytest.raises(ValueError, match=r"n_head \(3\) must divide n_embd \(16\)"):
        small_gpt(n_head=3)
    with pytest.raises(ValueError, match="longer than the model's block_size 16"):
        small_gpt()(torch.zeros(1, 17, dtype=torch.long))


def test_bundled_corpus_is_real_text_split_in_order() -> None:
    data = TextDataModule(block_size=64)
    text = read_text(None)
    assert len(text) > 1_000_000 and text.decode("utf-8").startswith("CHAPTER 1. Loomings.")
    train, val, test = (data.splits[name][0] for name in ("train", "val", "test"))  # byte tokens, no counts
    assert len(train) + len(val) + len(test) == len(text)
    assert bytes(test[-20:].tolist()) == text[-20:]  # the test text is the corpus's end
    data.setup("fit")
    inputs, targets = data.train_set[3]
    assert inputs.shape == targets.shape == (64,)
    assert torch.equal(inputs[1:], targets[:-1])  # targets are the inputs shifted by one
    assert data.vocab_size == 256


def test_windows_tile_evaluation_text_without_overlap() -> None:
    tokens = torch.arange(100, dtype=torch.uint8)
    windows = TokenWindows(tokens, block_size=10, stride=10)
    assert len(windows) == 9  # 9 full windows of 10 + 1 tokens fit in 100
    assert torch.equal(torch.cat([windows[i][1] for i in range(len(windows))]), tokens[1:91].long())
    assert len(TokenWindows(tokens, block_size=10, stride=5)) == 18


def test_a_batch_of_windows_comes_whole_as_default_collation_would_give_it() -> None:
    # One gather for the batch instead of a slice, a conversion and a stack per window (engine WholeBatches).
    tokens, counts = torch.randint(0, 256, (500,), dtype=torch.uint8), torch.randint(1, 4, (500,), dtype=torch.uint8)
    for windows in (TokenWindows(tokens, 16, 7), TokenWindows(tokens, 16, 7, token_bytes=counts)):
        indices = [5, 0, 30, 12]
        whole = windows.__getitems__(indices)
        expected = default_collate([windows[index] for index in indices])
        assert len(whole) == len(expected)
        for ours, theirs in zip(whole, expected, strict=True):
            assert ours.shape == (4, 16) and ours.dtype == theirs.dtype and ours.is_contiguous()
            assert torch.equal(ours, theirs)
    data = TextDataModule(batch_size=4, block_size=16)
    data.setup("fit")
    loader = data.train_dataloader()
    assert loader.collate_fn is whole_batch
    inputs, targets = next(iter(loader))[:2]
    assert inputs.shape == targets.shape == (4, 16) and torch.equal(inputs[:, 1:], targets[:, :-1])


BAD_TEXT = {
    "missing": ("missing.txt", None, "does not exist"),
    "no-txt-files": ("empty", None, r"has no files ending in \.txt; .* data\.suffixes"),
    "blank": ("blank.txt", b"  \n", "holds no text"),
    "not-utf8": ("latin1.txt", "café crème".encode("latin-1"), "not UTF-8"),
    "shorter-than-a-block": ("short.txt", b"too short", "fewer than one window"),
}


@pytest.mark.parametrize("case", BAD_TEXT)
def test_bad_text_fails_before_training_and_writes_no_run_folder(tmp_path: Path, case: str) -> None:
    name, content, message = BAD_TEXT[case]
    path = tmp_path / name
    if case == "no-txt-files":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    # The message names the field to fix (data.path, or data.block_size for a too short text).
    with user_error(rf"(?=.*data\.(path|block_size)).*{message}"):
        main(["fit", *shrunk_args(tmp_path / "run"), f"--config={EXPERIMENT}", f"--data.init_args.path={path}"])
    assert not [file for file in (tmp_path / "run").rglob("*") if file.is_file()]  # no run folder, no file


def test_suffixes_pick_the_files_a_folder_is_read_from(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    (folder / "deeper").mkdir(parents=True)
    (folder / "a.md").write_text("markdown " * 40)
    (folder / "deeper" / "b.RST").write_text("restructured " * 40)
    (folder / "c.txt").write_text("plain " * 40)
    (folder / "d.json").write_text('{"not": "text to learn"}')
    assert read_text(folder) == (folder / "c.txt").read_bytes()  # .txt only, by default
    # Jupyter's copy of a file beside it (test text that is also training text) and macOS's ._ file (not
    # UTF-8, which stopped the run) are no data, nor is anything under __MACOSX.
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "c-checkpoint.txt").write_text("plain " * 40)
    (folder / "._c.txt").write_bytes(b"\x00\x05\x16\x07\xff Mac OS X")
    (folder / "__MACOSX").mkdir()
    (folder / "__MACOSX" / "._c.txt").write_bytes(b"\x00\x05\x16\x07\xff Mac OS X")
    assert read_text(folder) == (folder / "c.txt").read_bytes()
    both = TextDataModule(path=str(folder), suffixes=(".md", "rst"), block_size=8, val_fraction=0.2, test_fraction=0.2)
    data = bytes(torch.cat([tokens for tokens, _ in both.splits.values()]).tolist())
    assert data == (folder / "a.md").read_bytes() + b"\n\n" + (folder / "deeper" / "b.RST").read_bytes()
    with pytest.raises(ValueError, match=r"data.suffixes must name at least one file ending"):
        TextDataModule(path=str(folder), suffixes=())


def write_dataset(folder: Path, form: str, documents: list[str | None]) -> tuple[Path, list[list[str | None]]]:
    """``documents`` as a Hugging Face dataset holds them: a table with a ``text`` column (and others), in two
    Parquet shards, one Arrow stream (``save_to_disk``'s) or file (Feather), or JSON Lines; the path and shards."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    shards = [documents[: len(documents) // 2], documents[len(documents) // 2 :]] if form == "parquet" else [documents]
    tables = [pa.table({"id": list(range(len(rows))), "text": rows, "source": ["web"] * len(rows)}) for rows in shards]
    if form == "parquet":
        for index, table in enumerate(tables):
            pq.write_table(table, folder / f"train-{index:05d}-of-00002.parquet", row_group_size=7)
        return folder, shards
    path = folder / ("data.jsonl" if form == "jsonl" else "data-00000-of-00001.arrow")
    if form == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in tables[0].to_pylist()))
    elif form == "arrow file":
        feather.write_feather(tables[0], path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, tables[0].schema) as writer:
            writer.write_table(tables[0], max_chunksize=7)
    return path, shards


@pytest.mark.parametrize("form", ["parquet", "arrow stream", "arrow file", "jsonl"])
def test_a_datasets_text_column_gives_the_tokens_of_the_same_text_in_files(tmp_path: Path, form: str) -> None:
    # A document a row; empty and missing rows carry no text. The same documents in text files, a file a shard,
    # give the same splits token for token: every guarantee of the text path holds for the table.
    documents = [f"Call me Ishmael, {i} — déjà 🐋. " * (i % 5 + 1) for i in range(60)]
    documents[3], documents[40] = "", None
    path, shards = write_dataset(tmp_path / "dataset", form, documents)
    files = tmp_path / "files"
    files.mkdir()
    for index, rows in enumerate(shards):
        (files / f"{index}.txt").write_text("\n\n".join(row for row in rows if row))
    settings = {"block_size": 8, "val_fraction": 0.2, "test_fraction": 0.2}
    suffixes = {"suffixes": (".parquet",)} if form == "parquet" else {}
    table, text = TextDataModule(path=str(path), **suffixes, **settings), TextDataModule(path=str(files), **settings)
    for split in ("train", "val", "test"):
        assert torch.equal(table.splits[split][0], text.splits[split][0]), split
    assert read_text(path, suffixes.get("suffixes", (".txt",))) == read_text(files)
{%- if cookiecutter.use_prepared == "yes" %}
    counts = TextDataModule(path=str(path), **suffixes, **settings).write_prepared(tmp_path / "prepared", block=64)
    on_disk = TextDataModule(path=str(path), **suffixes, **settings, prepared=str(tmp_path / "prepared"))
    for split in ("train", "val", "test"):
        assert torch.equal(torch.from_numpy(on_disk.splits[split][0][:]), text.splits[split][0]), split
    assert counts["bytes"] == len(read_text(files))
    prepared = {"prepared": str(tmp_path / "prepared")}
    other = TextDataModule(path=str(path), **suffixes, **settings, text_column="id", **prepared)
    with pytest.raises(ValueError, match=r"data.text_column='id', but data.prepared=.* was prepared with text_column="):
        other.splits  # noqa: B018
{%- endif %}


@pytest.mark.parametrize("form", ["parquet", "arrow stream"])
def test_a_datasets_chats_and_pairs_give_the_examples_of_the_same_jsonl(tmp_path: Path, form: str) -> None:
    # A chat dataset's shard: a messages column of {role, content} structs (and other columns); and pairs.
    import pyarrow as pa
    import pyarrow.parquet as pq

    chats = [
        {"id": i, "messages": [{"role": "user", "content": f"Who is {i}?"}, {"role": "assistant", "content": "Ahab."}]}
        for i in range(12)
    ]
    pairs = [{"id": i, "prompt": f"Whale {i}:", "completion": " white"} for i in range(12)]
    for name, rows in (("chats", chats), ("pairs", pairs)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        table, path = pa.Table.from_pylist(rows), tmp_path / f"{name}.{'parquet' if form == 'parquet' else 'arrow'}"
        if form == "parquet":
            pq.write_table(table, path, row_group_size=5)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=5)
        from_table = PromptCompletionDataModule(path=str(path), block_size=64)
        from_lines = PromptCompletionDataModule(path=str(tmp_path / f"{name}.jsonl"), block_size=64)
        for split in ("train", "val", "test"):
            for ours, theirs in zip(from_table.splits[split], from_lines.splits[split], strict=True):
                assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), (name, split)
    # A row without the columns is named by its row, as a JSONL line by its line.
    pq.write_table(pa.table({"text": ["no chat here"] * 3}), bad := tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet row 0 needs the strings .prompt. and .completion., or a"):
        PromptCompletionDataModule(path=str(bad)).splits  # noqa: B018


def write_split_dataset(folder: Path, layout: str, splits: dict[str, list[str]]) -> Path:
    """``splits`` ({split: documents}) as a Hugging Face dataset's split files: the Hub's ``data/<split>-*.parquet``
    (train in two shards) or ``save_to_disk``'s ``<split>/data-00000-of-00001.arrow``; the dataset's folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = {"train": "train", "val": "validation", "test": "test"}
    for split, documents in splits.items():
        table = pa.table({"text": documents, "id": list(range(len(documents)))})
        if layout == "hub":
            (folder / "data").mkdir(parents=True, exist_ok=True)
            half = len(documents) // 2
            halves = [table.slice(0, half), table.slice(half)] if split == "train" else [table]
            for index, half in enumerate(halves):
                pq.write_table(half, folder / "data" / f"{names[split]}-{index:05d}-of-{len(halves):05d}.parquet")
        else:
            (folder / names[split]).mkdir(parents=True)
            shard = folder / names[split] / "data-00000-of-00001.arrow"
            with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    return folder


@pytest.mark.parametrize(("layout", "given"), [("hub", ("train", "val", "test")), ("save_to_disk", ("train", "test"))])
def test_a_datasets_split_files_are_its_splits_and_only_a_missing_split_is_cut(
    tmp_path: Path, layout: str, given: tuple[str, ...]
) -> None:
    # Each split's own documents: its tokens are its files' text, exactly; a split the dataset lacks (val
    # here) is cut from the end of the training text, in memory and prepared alike.
    documents = {split: [f"{split} {i}: déjà 🐋 " * (i % 4 + 1) for i in range(40)] for split in given}
    path = write_split_dataset(tmp_path / "dataset", layout, documents)
    suffixes = (".parquet",) if layout == "hub" else (".arrow",)
    settings = {"path": str(path), "suffixes": suffixes, "block_size": 8, "val_fraction": 0.25, "test_fraction": 0.2}
    data = TextDataModule(**settings)
    text = {split: "\n\n".join(rows).encode() for split, rows in documents.items()}
    expected = dict(text)
    if "val" not in given:
        cut = len(text["train"]) * 3 // 4  # the last val_fraction of the training text (here on an ASCII byte)
        assert text["train"][cut] < 0x80
        expected["train"], expected["val"] = text["train"][:cut], text["train"][cut:]
    for split in ("train", "val", "test"):
        assert bytes(data.splits[split][0].tolist()) == expected[split], split
{%- if cookiecutter.use_prepared == "yes" %}
    counts = TextDataModule(**settings).write_prepared(tmp_path / "prepared", block=64)
    on_disk = TextDataModule(**settings, prepared=str(tmp_path / "prepared"))
    for split in ("train", "val", "test"):
        assert torch.equal(torch.from_numpy(on_disk.splits[split][0][:]), data.splits[split][0]), split
    assert counts["bytes"] == sum(len(part) for part in text.values())
{%- endif %}


def test_a_json_lines_corpus_is_read_a_batch_of_lines_at_a_time_and_a_bad_line_is_named(tmp_path: Path) -> None:
    # The first 4,096 lines come before line 4,097 is read (a whole-file reader would fail first); each bad line
    # is one line naming the file, the line and the fix.
    from {{ cookiecutter.package_name }}.engine.text_files import table_rows

    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"Call me Ishmael {i}.", "id": i}) for i in range(4096)]
    for bad, message in [
        ("{not json", r"corpus.jsonl line 4097 is not JSON \(.*\); write one object a line"),
        ("[1, 2]", r"corpus.jsonl line 4097 is not a JSON object"),
        ('{"text": 7}', r"corpus.jsonl line 4097: 'text' holds int, not text; name a text column in data.text_column"),
    ]:
        path.write_text("\n".join([*lines, bad]) + "\n")
        rows = table_rows(path, "text")
        assert next(rows) == [f"Call me Ishmael {i}." for i in range(4096)]
        with pytest.raises(ValueError, match=message):
            next(rows)
    path.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl has no object with 'text'; name the text column in data.text_"):
        list(table_rows(path, "text"))


def test_a_text_dataset_the_datasets_library_saved_reads_with_its_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets library is not installed (pip install datasets)")
    documents = {split: [f"{split} {i}: déjà 🐋." for i in range(30)] for split in ("train", "validation", "test")}
    saved = datasets.DatasetDict({split: datasets.Dataset.from_dict({"text": d}) for split, d in documents.items()})
    saved.save_to_disk(str(tmp_path / "saved"))
    data = TextDataModule(path=str(tmp_path / "saved"), suffixes=(".arrow",), block_size=8)
    for split, name in (("train", "train"), ("val", "validation"), ("test", "test")):
        assert bytes(data.splits[split][0].tolist()) == "\n\n".join(documents[name]).encode(), split


def test_a_hub_dataset_is_read_from_the_local_cache_by_its_address_and_never_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hf://datasets/<owner>/<name>[@<revision>]/<config folder>: the snapshot a download left in the cache
    # (HF_HUB_CACHE) reads as the same files in a folder; a dataset not in the cache is one line naming the
    # command that fetches it, and nothing is downloaded.
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    documents = {split: [f"{split} {i}: déjà 🐋 " * 3 for i in range(30)] for split in ("train", "test")}
    snapshot = cached_snapshot(cache, "melville/whales", "dataset")
    write_split_dataset(snapshot / "moby-2", "hub", documents)
    local = write_split_dataset(tmp_path / "local", "hub", documents)
    folder = TextDataModule(path=str(local), suffixes=(".parquet",), block_size=8)
    commit = snapshot.name
    for address in ("hf://datasets/melville/whales/moby-2", f"hf://datasets/melville/whales@{commit}/moby-2"):
        hub = TextDataModule(path=address, suffixes=(".parquet",), block_size=8)
        for split in ("train", "val", "test"):
            assert torch.equal(hub.splits[split][0], folder.splits[split][0]), (address, split)
    fetch = r"fetch it once where there is internet: `hf download melville/ahab --repo-type dataset --revision v2`"
    with pytest.raises(FileNotFoundError, match=rf"not in the local Hugging Face cache \(HF_HOME\).*; {fetch}"):
        TextDataModule(path="hf://datasets/melville/ahab@v2", suffixes=(".parquet",)).splits  # noqa: B018
    for address in ("hf://datasets/melville/whales/../../..", "hf://datasets/melville/whales@..%2F..%2Fx"):
        with pytest.raises(ValueError, match=r"climbs out of the dataset \('\.\.'\); name a path inside it"):
            TextDataModule(path=address, suffixes=(".parquet",)).splits  # noqa: B018


def test_split_files_beside_files_of_no_split_are_refused_and_text_files_stay_one_text(tmp_path: Path) -> None:
    path = write_split_dataset(tmp_path / "dataset", "hub", {"train": ["Call me Ishmael. " * 9] * 20})
    TextDataModule(path=str(path), suffixes=(".parquet",), block_size=8).splits  # noqa: B018
    (path / "data" / "train-00000-of-00002.parquet").rename(path / "data" / "extra.parquet")
    with pytest.raises(ValueError, match=r"dataset whose file names give its splits, but 1 file\(s\) name no split "
                       r"\(data/extra\.parquet\); name each file"):  # fmt: skip
        TextDataModule(path=str(path), suffixes=(".parquet",), block_size=8).splits  # noqa: B018
    only_test = write_split_dataset(tmp_path / "test only", "hub", {"test": ["Call me Ishmael. " * 9] * 20})
    with pytest.raises(ValueError, match=r"but no train split; name each file"):
        TextDataModule(path=str(only_test), suffixes=(".parquet",), block_size=8).splits  # noqa: B018
    # Text files are text, whatever their names: test.txt is read with the rest and cut by the fractions.
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.txt").write_text("Call me Ishmael. " * 40)
    (notes / "test.txt").write_text("Some years ago. " * 40)
    data = TextDataModule(path=str(notes), block_size=8, val_fraction=0.25, test_fraction=0.25)
    assert bytes(torch.cat([data.splits[s][0] for s in ("train", "val", "test")]).tolist()) == read_text(notes)


def test_a_datasets_own_test_file_of_chats_is_its_test_split(tmp_path: Path) -> None:
    # train.jsonl and a test shard of chats: the test split is the test file's examples, in order; val is cut
    # (val_fraction) from the training examples only, and train is the rest.
    import pyarrow as pa
    import pyarrow.parquet as pq

    def chat(i: int) -> dict:
        turns = [{"role": "user", "content": f"Who is {i}?"}, {"role": "assistant", "content": f"Ahab {i}."}]
        return {"messages": turns}

    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(chat(i)) + "\n" for i in range(20)))
    pq.write_table(pa.Table.from_pylist([chat(i) for i in range(100, 105)]), folder / "test-00000-of-00001.parquet")
    data = PromptCompletionDataModule(path=str(folder), block_size=64, val_fraction=0.25, test_fraction=0.1)
    alone = PromptCompletionDataModule(path=str(folder / "test-00000-of-00001.parquet"), block_size=64)
    pool = [*alone.splits["train"], *alone.splits["val"], *alone.splits["test"]]
    assert [example[0].tolist() for example in data.splits["test"]] == sorted(e[0].tolist() for e in pool)
    assert len(data.splits["val"]) == 5 and len(data.splits["train"]) == 15
    texts = {bytes(e[0].tolist()) for split in ("train", "val") for e in data.splits[split]}
    assert all(f"Who is {i}?".encode() in b"".join(texts) for i in range(20))
    (folder / "notes.jsonl").write_text(json.dumps(chat(7)) + "\n")
    with pytest.raises(ValueError, match=r"1 file\(s\) name no split \(notes\.jsonl\)"):
        PromptCompletionDataModule(path=str(folder), block_size=64).splits  # noqa: B018


@pytest.mark.parametrize(
    ("column", "content", "message"),
    [
        ("body", None, r"has no column 'body' \(its columns: id, text, source\); name the text column in data\.text_"),
        ("id", None, r"column 'id' holds int64, not text; name a text column in data.text_column"),
        ("text", b"PAR1 not a table", r"is not a readable Parquet table \(.*\); check the file"),
    ],
    ids=["no-such-column", "not-text", "garbage"],
)
def test_a_table_without_its_text_column_fails_before_training_and_writes_nothing(
    tmp_path: Path, column: str, content: bytes | None, message: str
) -> None:
    path, _ = write_dataset(tmp_path / "dataset", "parquet", ["Call me Ishmael. " * 20] * 30)
    if content is not None:
        (path / "train-00000-of-00002.parquet").write_bytes(content)
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={path}", "--data.init_args.suffixes=[.parquet]"]
    with user_error(rf"data.path: {re.escape(str(path))}/train-0000\d-of-00002.parquet:? .*{message}"):
        main(["fit", *shrunk_args(tmp_path / "run"), *args, f"--data.init_args.text_column={column}"])
    assert not [file for file in (tmp_path / "run").rglob("*") if file.is_file()]  # no run folder, no file


def test_a_data_folder_is_walked_once_per_folder_and_within_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data.path may come from a received checkpoint: ``/`` must be refused, not searched, and a link to a
    parent folder read once, not followed without end."""
    folder = tmp_path / "corpus"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "x.txt").write_text("words " * 40)
    (folder / "y.txt").write_text("more words " * 40)
    (folder / "a" / "up").symlink_to(folder)  # a path without end to a walk that follows every link
    (folder / "z.txt").symlink_to("/dev/zero")  # not a regular file: never read
    assert [path.relative_to(folder).as_posix() for path in checked_text_files(folder)] == ["a/x.txt", "y.txt"]
    monkeypatch.setattr(datamodule, "MAX_DATA_ENTRIES", 4)
    with pytest.raises(DataError, match=rf"^data.path: {re.escape(str(folder))} holds more than 4 files and folders:"):
        TextDataModule(path=str(folder), block_size=8).splits  # noqa: B018
    (folder / "a" / "up").unlink()  # 4 entries: read
    assert len(checked_text_files(folder)) == 2


def test_a_python_corpus_keeps_the_names_users_write_and_reports_what_tools_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A package's __init__.py and __main__.py are code someone wrote (the old rule, every name starting with
    # "__", dropped them silently); __pycache__ and hidden copies are a tool's, left out and said so.
    folder = tmp_path / "corpus"
    (folder / "pkg" / "__pycache__").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("from pkg.core import run\n" * 20)
    (folder / "pkg" / "__main__.py").write_text("run()\n" * 20)
    (folder / "pkg" / "core.py").write_text("def run():\n    return 42\n" * 20)
    (folder / "pkg" / "__pycache__" / "core.cpython-311.py").write_text("a tool's copy\n" * 20)
    (folder / ".hidden.py").write_text("an editor's backup\n" * 20)
    read = checked_text_files(folder, (".py",))
    names = [path.relative_to(folder).as_posix() for path in read]
    assert names == [f"pkg/{name}.py" for name in ("__init__", "__main__", "core")]
    data = TextDataModule(path=str(folder), suffixes=(".py",), block_size=8, val_fraction=0.2, test_fraction=0.2)
    with caplog.at_level(logging.INFO):
        assert len(data.splits) == 3
    (line,) = [line for line in caplog.text.splitlines() if "Text of " in line]
    assert f"data.path={folder}: 3 file(s), 2 left out as tools' files (.hidden.py, pkg/__pycache__/core" in line


def test_a_run_reports_the_files_bytes_tokenizer_and_tokens_per_split_it_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("Call me Ishmael. " * 300)
    (folder / "b.txt").write_text("   \n")  # blank: left out, and not counted as read
    (folder / "c.txt").write_text("Some years ago, never mind how long precisely. " * 100)
    (folder / "d.md").write_text("not read: .txt only")
    data = TextDataModule(path=str(folder), block_size=16, val_fraction=0.1, test_fraction=0.2)
    with caplog.at_level(logging.INFO):
        splits = data.splits
    size = len((folder / "a.txt").read_bytes() + b"\n\n" + (folder / "c.txt").read_bytes())
    tokens = ", ".join(f"{name} {len(splits[name][0]):,}" for name in ("train", "val", "test"))
    assert sum(len(tokens) for tokens, _ in splits.values()) == size  # bytes: a token each
    (line,) = [line for line in caplog.text.splitlines() if "Text of " in line]
    assert line.endswith(
        f"Text of data.path={folder}: 2 file(s), {size / 1e6:.2f} MB of UTF-8; tokenizer bytes (256 ids); "
        f"tokens {tokens} (val and test: the last 0.1 and 0.2 of the bytes)"
    )
{%- if cookiecutter.use_prepared == "yes" %}


def test_a_prepared_corpus_holds_exactly_the_tokens_of_memory(tmp_path: Path) -> None:
    # Read 64 bytes at a time: cuts fall inside files, inside a line longer than a block, and next to
    # multi-byte characters; the prepared tokens must still equal the in-memory ones, split by split.
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("Ahab — le capitaine, déjà parti.\n" * 9 + "ß" * 100 + "\n")
    (folder / "b.txt").write_text("")  # left out, as in memory
    (folder / "c.txt").write_text("Ishmael 🐋 " * 30)
    settings = {"path": str(folder), "block_size": 8, "val_fraction": 0.3, "test_fraction": 0.2}
    in_memory = TextDataModule(**settings)
    counts = TextDataModule(**settings).write_prepared(tmp_path / "prepared", block=64)
    on_disk = TextDataModule(**settings, prepared=str(tmp_path / "prepared"))
    for split in ("train", "val", "test"):
        expected, actual = in_memory.splits[split][0], torch.from_numpy(on_disk.splits[split][0][:])
        assert torch.equal(expected, actual) and counts[split] == len(expected), split
    assert counts["bytes"] == len(read_text(folder)) and on_disk.vocab_size == 256
    bundled = TextDataModule(block_size=8)
    TextDataModule(block_size=8).write_prepared(tmp_path / "bundled")
    prepared = TextDataModule(block_size=8, prepared=str(tmp_path / "bundled"))
    assert torch.equal(bundled.splits["test"][0], torch.from_numpy(prepared.splits["test"][0][:]))

    # A file that is not UTF-8 is named with its byte offset, across the blocks it is read in.
    (folder / "c.txt").write_bytes(b"x" * 100 + "café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"c.txt is not UTF-8 text \(byte 103: b'\\xe9'\)"):
        checked_text_files(folder, block=64)
{%- else %}


def test_a_file_that_is_not_utf8_is_named_with_its_byte_offset(tmp_path: Path) -> None:
    # Read a block at a time: the offset counts across the blocks.
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "c.txt").write_bytes(b"x" * 100 + "café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"c.txt is not UTF-8 text \(byte 103: b'\\xe9'\)"):
        checked_text_files(folder, block=64)
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow  # a SIGTERM and a resume: two more processes (CI: .ci/slow)
def test_a_prepared_corpus_trains_and_resumes_exactly_as_in_memory_after_it_moved(tmp_path: Path) -> None:
    # The reference: in memory, 20 steps. The prepared run reads windows from disk through two loader
    # workers, is stopped by SIGTERM after step 13 (mid-epoch 2), its text moved away, and resumed.
    folder = write_texts(tmp_path / "texts")
    out = tmp_path / "prepared"
    source = [f"--config={CONFIGS / 'default.yaml'}", f"--config={EXPERIMENT}", f"--data.init_args.path={folder}"]
    prepare_main(["--out", str(out), *source])
    common = [f"--config={EXPERIMENT}", f"--data.init_args.path={folder}", "--trainer.max_epochs=2"]
    common += ["--test_after_fit=false", "--trainer.deterministic=true"]
    assert_prepared_run_resumes_as_in_memory(tmp_path, common, out, folder, step=13)

    # Damage after prepare is named before training: a missing shard, another block of settings.
    (out / "test" / "tokens-00000.bin").unlink()
    with user_error(r"data.prepared: .*tokens-00000.bin is missing \(deleted since prepare\?\); run `make prepare"):
        main(["fit", *shrunk_args(tmp_path / "bad"), *common, f"--data.init_args.prepared={out}"])
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("*.*"))
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow
def test_a_prepared_corpus_under_ddp_stopped_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # Two processes, each reading its share of the prepared windows, 2 epochs; SIGTERM mid-epoch 2.
    folder = write_texts(tmp_path / "texts")
    out = tmp_path / "prepared"
    prepare_main(["--out", str(out), f"--config={CONFIGS / 'default.yaml'}", f"--config={EXPERIMENT}",
                  f"--data.init_args.path={folder}"])  # fmt: skip
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={folder}", f"--data.init_args.prepared={out}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda root: [*shrunk_args(root), *args], step=7)
{%- else %}


@pytest.mark.slow
def test_a_corpus_under_ddp_stopped_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # Two processes, each reading its share of the windows, 2 epochs; SIGTERM mid-epoch 2.
    folder = write_texts(tmp_path / "texts")
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={folder}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda root: [*shrunk_args(root), *args], step=7)
{%- endif %}


@pytest.mark.slow
def test_a_datasets_parquet_shards_stopped_by_sigterm_resume_exactly(tmp_path: Path) -> None:
    # write_texts' sentences as a dataset's train, validation and test shards, a sentence a row; SIGTERM after
    # step 7.
    # Under DDP the engine splits and resumes every map-style data set alike (this file's DDP run, on prepared or
    # in-memory data);
    # what is the data set's own, the same examples in the same order after a restart, is held here in one process.
    folder = write_texts(tmp_path / "texts")
    documents = [line for file in sorted(folder.iterdir()) for line in file.read_text().splitlines()]
    splits = {"train": documents[:3200], "val": documents[3200:3600], "test": documents[3600:]}
    path = write_split_dataset(tmp_path / "dataset", "hub", splits)
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={path}", "--data.init_args.suffixes=[.parquet]"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    assert_run_resumes_exactly(tmp_path, lambda root: [*shrunk_args(root), *args], step=7)


NOUNS = ["the whale", "the sea", "a ship", "the captain", "an oar"]
VERBS = ["sees", "follows", "leaves", "finds"]


def write_texts(folder: Path) -> Path:
    """A folder of two .txt files in a small, regular language: a model can learn it well in a minute."""
    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    for name in ("a.txt", "b.txt"):
        picks = torch.randint(0, 20, (2_000, 3), generator=generator).tolist()
        lines = [f"{NOUNS[s % 5]} {VERBS[v % 4]} {NOUNS[o % 5]}." for s, v, o in picks]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def unigram_bits(data: bytes) -> float:
    counts, total = Counter(data), len(data)
    return -sum(n / total * math.log2(n / total) for n in counts.values())


@pytest.mark.slow
def test_own_folder_of_text_trains_below_its_unigram_entropy_and_generates(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = write_texts(tmp_path / "texts")
    args = [*shrunk_args(tmp_path), f"--data.init_args.path={folder}"]  # the path alone: no code, no other config
    cli = main(
        [
            "fit",
            *args,
            *("--model.init_args.net.init_args.n_layer=2", "--model.init_args.net.init_args.n_embd=64"),
            *("--trainer.max_epochs=5", "--trainer.limit_train_batches=60", "--data.init_args.block_size=32"),
        ]
    )
    run = Path(cli.trainer.checkpoint_callback.dirpath).parent
    summary = json.loads((run / "test_metrics.json").read_text())
    # A line is three independent picks (5 x 4 x 5 choices, 6.6 bits) in about 24 bytes: 0.28 bits
    # per byte is the best possible; letters alone (the unigram entropy) need about 3.6.
    assert unigram_bits(read_text(folder)) > 3.0
    assert summary["metrics"]["test/bpb"] < 0.6  # measured: 0.35
    assert (run / "curves.png").is_file() and not (run / "confusion_matrix.png").exists()
    assert summary["metrics"]["test/ppl"] == pytest.approx(2 ** summary["metrics"]["test/bpb"], rel=1e-4)

    # The checkpoint alone rebuilds the model and samples: `make generate CKPT=... PROMPT=...`.
    capsys.readouterr()
    generate_main(["--ckpt", summary["checkpoint"], "--prompt", "the whale ", "--max_new_tokens", "120"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("the whale ")
    noun, verb = "|".join(NOUNS), "|".join(VERBS)
    sentence = re.compile(rf"^({noun}) ({verb}) ({noun})\.$")
    assert sum(bool(sentence.match(line)) for line in lines[:-1]) >= 3  # the last line may be cut off

    model = LanguageModel.load_from_checkpoint(summary["checkpoint"], weights_only=True)
    with pytest.raises(ValueError, match="the prompt has 33 UTF-8 bytes"):
        model.generate(torch.tensor([list(b"x" * 33)]), 5)


@pytest.mark.slow
def test_a_text_dataset_and_a_chat_dataset_train_to_their_scores(tmp_path: Path) -> None:
    # A Hugging Face text dataset (train, validation and test shards of write_texts' sentences) through the
    # default config, then a chat dataset's shards (user: a noun, assistant: the verb it goes with) through
    # configs/experiments/chat.yaml from that checkpoint; each scored on its own test split.
    files = sorted(write_texts(tmp_path / "texts").iterdir())
    sentences = [line for file in files for line in file.read_text().splitlines()]
    splits = {"train": sentences[:3200], "val": sentences[3200:3600], "test": sentences[3600:]}
    path = write_split_dataset(tmp_path / "dataset", "hub", splits)
    model = ("--model.init_args.net.init_args.n_layer=2", "--model.init_args.net.init_args.n_embd=64")
    data = [f"--data.init_args.path={path}", "--data.init_args.suffixes=[.parquet]"]
    cli = main(["fit", *shrunk_args(tmp_path / "text"), *data, *model, "--trainer.max_epochs=5",
                "--trainer.limit_train_batches=60"])  # fmt: skip
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["metrics"]["test/bpb"] < 0.6  # the best possible about 0.28, letters alone about 3.6

    import pyarrow as pa
    import pyarrow.parquet as pq

    answers = dict(zip(NOUNS, ["dives", "rolls", "sails", "shouts", "rows"], strict=True))

    def chats(count: int, seed: int) -> pa.Table:
        picks = torch.randint(0, len(NOUNS), (count,), generator=torch.Generator().manual_seed(seed)).tolist()
        turns = [[{"role": "user", "content": NOUNS[i]}, {"role": "assistant", "content": answers[NOUNS[i]]}]
                 for i in picks]  # fmt: skip
        return pa.table({"messages": turns})

    (tmp_path / "chats").mkdir()
    pq.write_table(chats(400, 0), tmp_path / "chats" / "train-00000-of-00001.parquet")
    pq.write_table(chats(40, 1), tmp_path / "chats" / "test-00000-of-00001.parquet")
    chat = main(["fit", *shrunk_args(tmp_path / "chat"), *model, f"--config={CONFIGS / 'experiments' / 'chat.yaml'}",
                 f"--data.init_args.path={tmp_path / 'chats'}", "--data.init_args.block_size=32",
                 f"--model.init_args.init_from={summary['checkpoint']}", "--trainer.max_steps=150",
                 "--trainer.val_check_interval=50", "--trainer.limit_train_batches=1.0"])  # fmt: skip
    scores = json.loads((Path(chat.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    # Scored on the answers and their end byte only: the answer is known from the noun, so learning the
    # pairs takes it far below a guess among the five answers (log2(5) bits over about 6 bytes: 0.39).
    assert scores["metrics"]["test/bpb"] < 0.2, scores


def test_a_trained_model_generates_{{ "and_serves_" if cookiecutter.use_serving == "yes" else "" }}after_its_text_moved(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the whale sees the sea.\n" * 400)
    cli = main(["fit", *shrunk_args(tmp_path), f"--data.init_args.path={corpus}", "--test_after_fit=false"])
    checkpoint = Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    corpus.rename(tmp_path / "moved.txt")
    trained = load_trained(checkpoint)  # the checkpoint alone: the text is not read
    (completion,) = {{ 'trained.model.infer(trained.predictor, trained.datamodule.inputs_from_json(["the whale"]))' if cookiecutter.use_serving == "yes" else 'greedy_completions(trained, ["the whale"])' }}
    assert isinstance(completion, str) and completion
{%- if cookiecutter.use_serving == "yes" %}
    assert "max_bytes" in trained.datamodule.request_schema()  # what make serve's start-up asks
{%- endif %}
    capsys.readouterr()
    generate_main(["--ckpt", str(checkpoint), "--prompt", "the ", "--max_new_tokens", "20"])
    assert capsys.readouterr().out.startswith("the ")
    with user_error(rf"{corpus}.* does not exist"):  # the test split needs the text, and says so
        predict_main(["--ckpt", str(checkpoint), "--output", str(tmp_path / "predictions.jsonl")])


def test_a_run_shorter_than_an_epoch_validates_and_tests_its_best_checkpoint(tmp_path: Path) -> None:
    # The README's quick try (--trainer.max_steps=200) stops long before the first epoch ends.
    trainer = yaml.safe_load((CONFIGS / "trainer.yaml").read_text())
    interval = trainer["val_check_interval"]
    assert isinstance(interval, int) and trainer["check_val_every_n_epoch"] is None  # counted in steps
    args = [*shrunk_args(tmp_path), f"--trainer.val_check_interval={interval}"]
    cli = main(["fit", *args, "--trainer.limit_train_batches=null", f"--trainer.max_steps={interval}"])
    assert cli.trainer.num_training_batches > interval  # the epoch was not over
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["checkpoint"] is not None and summary["global_step"] == interval


def test_max_steps_ends_the_run_and_its_last_step_validates(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The shrunk run has 10 batches an epoch and max_epochs 1: max_steps=25 used to stop at step 10
    # (max_epochs first) without a word, and a last step between validations left no best checkpoint.
    args = [*shrunk_args(tmp_path), "--trainer.val_check_interval=20", "--trainer.max_steps=25"]
    with caplog.at_level(logging.INFO):
        cli = main(["fit", *args])
    assert "trainer.max_steps=25 ends this run; trainer.max_epochs=1 is lifted" in caplog.text
    assert cli.trainer.global_step == 25  # three epochs of 10 batches, cut at 25
    best = Path(cli.trainer.checkpoint_callback.best_model_path)
    assert "step000025" in best.name  # validated at step 20 and at the last step, 25
    summary = json.loads((best.parent.parent / "test_metrics.json").read_text())
    assert summary["checkpoint"] == str(best) and summary["global_step"] == 25

    # Shorter than one validation interval: it still validates once, at its end.
    cli = main(["fit", *shrunk_args(tmp_path / "short"), "--trainer.val_check_interval=20", "--trainer.max_steps=7"])
    assert "step000007" in Path(cli.trainer.checkpoint_callback.best_model_path).name


def test_generate_without_a_checkpoint_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with user_error("no checkpoint under logs/: train first"):
        generate_main([])


def test_bundled_corpus_ships_gzipped_inside_the_package() -> None:
    from importlib import resources

    packed = resources.files("{{ cookiecutter.package_name }}.data").joinpath("corpora", "moby_dick.txt.gz")
    assert gzip.decompress(packed.read_bytes()) == read_text(None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the gpu preset)")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gpu_preset_trains_the_gpt(tmp_path: Path, compiled: bool) -> None:
    gpu = [f"--config={CONFIGS / 'presets' / 'gpu.yaml'}", "--trainer.accelerator=gpu", "--trainer.max_epochs=2"]
    cli = main(["fit", *shrunk_args(tmp_path), *gpu, f"--model.init_args.compile={str(compiled).lower()}"])
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    # 20 steps of a one-block GPT: below the 8 bits of a uniform guess over 256 bytes, and finite.
    assert math.isfinite(summary["metrics"]["test/loss"]) and summary["metrics"]["test/bpb"] < 7.0
    # Compiled in place: the checkpoint's keys are eager's, loadable without the compiler.
    saved = torch.load(Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt", weights_only=True)["state_dict"]
    assert set(saved) == set(LanguageModel(net=GPT(n_layer=1, n_head=2, n_embd=32, block_size=32)).state_dict())


def test_bits_per_byte_and_perplexity_weigh_each_batch_by_its_bytes_and_tokens() -> None:
    bpb, ppl = BitsPerByte(), Perplexity()
    for nats, text_bytes, tokens in ((30.0, 10, 5), (10.0, 40, 40)):
        bpb.update(torch.tensor(nats) / text_bytes, weight=torch.tensor(text_bytes))
        ppl.update(torch.tensor(nats) / tokens, weight=torch.tensor(tokens))
    assert bpb.compute().item() == pytest.approx(40.0 / 50 / math.log(2))  # total nats / total bytes, in bits
    assert ppl.compute().item() == pytest.approx(math.exp(40.0 / 45))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# torch's own notice that its sync debug mode is a prototype (it may miss syncs, never invents one).
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")
def test_a_training_step_synchronises_the_gpu_only_where_the_engine_says() -> None:
    # The metric updates of every step stay on the device: torchmetrics' MeanMetric checked each
    # update for NaNs with a host sync, so the GPU idled while the host launched the backward pass.
    model = LanguageModel(net=GPT(n_layer=1, n_head=2, n_embd=32, block_size=32)).cuda()
    batch = tuple(torch.randint(0, 256, (4, 32), device="cuda") for _ in range(2))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.shared_step(batch, model.train_metrics).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


class SyncFreeWindow(L.Callback):
    """Makes any host-device synchronisation an error from the start of step ``first`` to the end of step ``last``."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.first:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.last + 1:  # global_step counts the step just taken
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")  # torch's notice, as above
@pytest.mark.parametrize("on_device", [True, False], ids=["non-finite-check-on-device", "non-finite-check-synchronous"])
def test_training_steps_with_the_default_callbacks_never_wait_for_the_gpu(tmp_path: Path, on_device: bool) -> None:
    # make train's steps under the gpu preset: the host queues step n+1 while the GPU runs step n,
    # because nothing between the logging intervals waits for the device: not the metrics, not the
    # callbacks, not the NaN guard (StopOnNonFinite hands its verdict to the fused optimizer). The
    # synchronous guard is the control: the same window then fails, so the check sees syncs.
    gpu = [f"--config={CONFIGS / 'presets' / 'gpu.yaml'}", "--trainer.accelerator=gpu", "--trainer.max_steps=10"]
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=100", "--test_after_fit=false"]
    cli = main([*shrunk_args(tmp_path), *gpu, *quiet], run=False)
    guard = next(c for c in cli.trainer.callbacks if isinstance(c, StopOnNonFinite))
    guard.on_device = on_device
    cli.trainer.callbacks.append(SyncFreeWindow(first=3, last=7))
    try:
        if on_device:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
            assert cli.trainer.global_step == 10
        else:
            with pytest.raises(RuntimeError, match="synchroniz"):
                cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        torch.cuda.set_sync_debug_mode("default")
