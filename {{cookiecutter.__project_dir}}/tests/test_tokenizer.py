"""The trained tokenizer (data.tokenizer: bpe): learnt from the training split only, lossless, the same
in pieces as whole, saved in the checkpoint{{ " and the prepared data set" if cookiecutter.use_prepared == "yes" else "" }}, refused where it cannot work."""

import json
import sys
import textwrap
from pathlib import Path

import pytest
{%- if cookiecutter.use_prepared == "yes" %}
import torch
{%- endif %}
from conftest import (
    CONFIGS,
{%- if cookiecutter.use_prepared == "yes" %}
    assert_prepared_run_resumes_as_in_memory,
{%- endif %}
{%- if cookiecutter.use_serving != "yes" %}
    greedy_completions,
{%- endif %}
    leaves,
    replaced,
    run_hostile_cases,
    shrunk_args,
    user_error,
)
{%- if cookiecutter.use_prepared == "yes" %}
from test_language_model import write_texts
{%- endif %}

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.generate import main as generate_main
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.commands.prepare import main as prepare_main
{%- endif %}
from {{ cookiecutter.package_name }}.data import PromptCompletionDataModule, TextDataModule{{ ", text" if cookiecutter.use_prepared == "yes" else "" }}
from {{ cookiecutter.package_name }}.data.tokenizer import BPETokenizer, safe_pieces, safe_stream
from {{ cookiecutter.package_name }}.engine.checkpoints import CheckpointError, read_checkpoint
from {{ cookiecutter.package_name }}.engine.errors import DataError
from {{ cookiecutter.package_name }}.engine.inference import load_trained
from {{ cookiecutter.package_name }}.models import LanguageModel
from {{ cookiecutter.package_name }}.nets import GPT

BPE = [f"--config={CONFIGS / 'experiments' / 'bpe.yaml'}", "--data.init_args.bpe_vocab_size=300"]
# Blank lines, runs of spaces, tabs, no-break spaces, accents, emoji, a long unbroken line: the places
# where a piece's end could change its tokens.
AWKWARD = (
    "Call me Ishmael.  Some years ago—never mind how long precisely—\n\n\n"
    "having little\u00a0or no money in my purse,\tand nothing particular to interest me on shore,\n"
    "   I thought I would sail about a little 🐋 and see the watery part of the world. déjà vu\r\n" + "x" * 300 + "\n"
)


def chunks(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def test_bpe_is_lossless_counts_bytes_and_tokenizes_in_pieces_as_whole() -> None:
    text = AWKWARD * 20
    tokenizer = BPETokenizer.train([text], 400)
    assert tokenizer.vocab_size == 400 and tokenizer.eos_id == 0
    ids, counts = tokenizer.encode_with_bytes(text)
    assert tokenizer.decode(ids) == text and sum(counts) == len(text.encode("utf-8"))
    assert len(ids) < len(text.encode("utf-8")) / 2  # the merges do compress
    whole = tokenizer.backend.encode(text).ids  # the library's own encoding of the text at once
    assert ids == whole
    # Read a block at a time{{ " (make prepare)" if cookiecutter.use_prepared == "yes" else "" }}, regrouped into pieces of at least ``group`` characters that
    # end where a token never spans: the same tokens. (The 300 x's are no place to cut: a group of
    # less than 300 / 4 characters would be cut inside them, as safe_stream's docstring says.)
    for size, group in ((7, 100), (50, 100), (333, 666)):
        streamed = [i for piece in safe_stream(chunks(text, size), group) for i in tokenizer.encode(piece)]
        assert streamed == whole, size
        assert "".join(safe_pieces(text, size)) == text
    # Training is deterministic and blind to how the text was cut: every DDP rank gets the same one.
    again = BPETokenizer.train(safe_stream(chunks(text, 61), size=200), 400)
    assert again.to_json() == tokenizer.to_json()
    assert BPETokenizer.from_json(tokenizer.to_json()).encode(text) == ids


CATASTROPHIC = {"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": "b"}  # backtracks on "aaaa...!"
GROWS = {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": " "}, "content": " " * 10}] * 8}


@pytest.mark.parametrize(
    ("part", "value", "refusal"),
    [
        ("normalizer", CATASTROPHIC, "normalizer"),
        ("normalizer", GROWS, "normalizer"),
        (
            "post_processor",
            {"type": "TemplateProcessing", "single": "$A " * 1000, "pair": "$A $B", "special_tokens": dict()},
            "post_processor",
        ),
        (
            "pre_tokenizer",
            {"type": "Split", "pattern": {"Regex": "(x+x+)+y"}, "behavior": "Isolated", "invert": False},
            "pre_tokenizer",
        ),
        ("model.dropout", 0.5, "model.dropout"),
        ("model.byte_fallback", True, "model.byte_fallback"),
    ],
)
def test_a_saved_tokenizer_runs_only_the_pipeline_this_project_trains(part: str, value, refusal: str) -> None:
    # A checkpoint's tokenizer JSON is data: tokenizers runs any pipeline it declares on every prompt (a Regex
    # normalizer made `generate` spin past 60 s on a 1.9 KB prompt; a chain of Replace grows a text 10x a step).
    tree = json.loads(BPETokenizer.train([AWKWARD * 5], 300).to_json())
    if part.startswith("model."):
        field = part.split(".", 1)[1]
        tree["model"][field] = {**tree["model"][field], **value} if isinstance(value, dict) else value
    else:
        tree[part] = value
    with pytest.raises(DataError, match=rf"checkpoint: the saved BPE tokenizer's {refusal} is not as this project "):
        BPETokenizer.from_json(json.dumps(tree))


TOKENIZER_LEAVES = textwrap.dedent(
    """
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
    from {{ cookiecutter.package_name }}.data.tokenizer import BPETokenizer
    from {{ cookiecutter.package_name }}.engine.errors import UserError

    for case in json.loads(open(sys.argv[1]).read()):
        start = time.perf_counter()
        try:
            BPETokenizer.from_json(case["text"]).encode("Call me Ishmael. " * 20)
            outcome = "ran"
        except UserError as error:
            outcome = "refused" if "\\n" not in str(error) else "refused over several lines"
        except Exception as error:  # a traceback: not a one-line refusal
            outcome = f"traceback {type(error).__name__}: {str(error)[:120]}"
        print(json.dumps({"leaf": case["leaf"], "value": case["value"], "outcome": outcome,
                          "seconds": time.perf_counter() - start}), flush=True)
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS: Linux")
def test_every_leaf_of_a_saved_tokenizer_is_data(tmp_path: Path) -> None:
    # One leaf of each kind of a real BPE's JSON (a vocabulary entry, a merge's half, every pipeline field) is
    # replaced in turn by each hostile value, and the tokenizer read and run as a checkpoint's is: nothing may take
    # memory past the limit or long, and a refusal is one line.
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    hostile = {
        "class spec": {"class_path": "os.system", "init_args": dict(command="id")},
        "dotted function": "os.system",
        "path outside": "/etc/passwd",
        "http URL": "http://127.0.0.1:9/x",
        "id past u32": 2**40,
        "largest u32 id": 2**32 - 1,
        "negative": -5,
        "float": 0.5,
        "deep nesting": deep,
        "wide mapping": {f"k{index}": index for index in range(100_000)},
        "long text": "a" * 5_000_000,
        "null": None,
    }
    tree = json.loads(BPETokenizer.train([AWKWARD * 5], 300).to_json())
    kinds: dict[tuple, tuple] = {}
    for where, _ in leaves(tree):  # list positions alike, and every vocabulary entry alike
        kind = tuple("*" if isinstance(key, int) or where[:2] == ("model", "vocab") else key for key in where)
        kinds.setdefault(kind, where)
    cases = [
        {"leaf": ".".join(map(str, where)), "value": label, "text": json.dumps(replaced(tree, where, value))}
        for where in kinds.values()
        for label, value in hostile.items()
    ]
    limit = 8 << 30  # bytes of address space (tokenizers reserves thread stacks): a u32-indexed vocabulary takes 32 GB
    results = run_hostile_cases(TOKENIZER_LEAVES, cases, tmp_path, limit)
    assert len(results) == len(cases) > 100
    loud = [r for r in results if not r["outcome"].startswith(("ran", "refused"))]  # a hang: the timeout above
    assert loud == [], "\n".join(f"{r['leaf']} = {r['value']}: {r['outcome']}" for r in loud[:30])
    print(f"{len(results)} cases: {sum(r['outcome'] == 'ran' for r in results)} ran, the rest refused in one line")


def test_bpe_learns_from_the_training_split_only(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the whale sees the sea and the ship.\n" * 900 + "zyzzyva quokka.\n" * 100)
    data = TextDataModule(path=str(corpus), tokenizer="bpe", bpe_vocab_size=320, block_size=16)
    # The held-out text's words were never seen: they stay in small pieces, unlike training words.
    assert len(data.tokenizer.encode(" quokka")) >= 3 and len(data.tokenizer.encode(" whale")) == 1
    on_everything = BPETokenizer.train([corpus.read_text()], 320)
    assert len(on_everything.encode(" quokka")) == 1  # the control: seen, it would be merged
    assert data.vocab_size == data.tokenizer.vocab_size <= 320  # fewer: this text has few distinct merges
    # Every byte of the text counted once over the splits: bits per byte are per byte of text.
    counts = [data.splits[split][1] for split in ("train", "val", "test")]
    assert sum(int(split.sum()) for split in counts) == corpus.stat().st_size
    assert all(int(split.min()) >= 1 for split in counts)


def test_a_bpe_run_saves_its_tokenizer_and_generates_after_its_text_moved(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the whale sees the sea. the ship follows the whale.\n" * 1200)
    args = [*shrunk_args(tmp_path), *BPE, f"--data.init_args.path={corpus}", "--test_after_fit=false"]
    cli = main(["fit", *args])
    assert cli.datamodule.hparams.block_size == 32  # bpe.yaml changes the tokenizer only
    tokenizer = cli.datamodule.tokenizer
    assert cli.model.net.token_embedding.num_embeddings == tokenizer.vocab_size <= 300
    assert cli.model.tokenizer is tokenizer
    checkpoint = Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    saved = read_checkpoint(checkpoint)
    assert saved["tokenizer"] == tokenizer.to_json() == saved["TextDataModule"]["tokenizer"]
    assert saved["hyper_parameters"]["tokenizer"] == "bpe"  # a name in the settings; the vocabulary beside them

    corpus.rename(tmp_path / "moved.txt")
    trained = load_trained(checkpoint)  # the checkpoint alone: the text is not read
    assert trained.model.tokenizer.to_json() == trained.datamodule.tokenizer.to_json() == tokenizer.to_json()
    (completion,) = {{ 'trained.model.infer(trained.predictor, trained.datamodule.inputs_from_json(["the whale"]))' if cookiecutter.use_serving == "yes" else 'greedy_completions(trained, ["the whale"])' }}
    assert isinstance(completion, str) and completion
{%- if cookiecutter.use_serving == "yes" %}
    assert trained.datamodule.inference_files() == {"tokenizer.json": tokenizer.to_json()}  # beside an export
    assert "tokenizer.json" in trained.datamodule.raw_description()
{%- endif %}
    capsys.readouterr()
    generate_main(["--ckpt", str(checkpoint), "--prompt", "the whale", "--max_new_tokens", "10"])
    assert capsys.readouterr().out.startswith("the whale")

    # Resumed on a text that trains another tokenizer: refused before training goes on.
    corpus.write_text("an entirely different text about quokkas and zyzzyvas.\n" * 300)
    with user_error("the BPE trained on the text now differs from the checkpoint's"):
        main(["fit", *args, "--resume=true", "--trainer.max_epochs=2"])
{%- if cookiecutter.use_prepared == "yes" %}


def test_a_prepared_bpe_corpus_holds_exactly_the_tokens_of_memory(tmp_path: Path, monkeypatch) -> None:
    folder = write_texts(tmp_path / "texts")
    out = tmp_path / "prepared"
    settings = {"path": str(folder), "tokenizer": "bpe", "bpe_vocab_size": 300, "block_size": 8}
    in_memory = TextDataModule(**settings)
    TextDataModule(**settings).write_prepared(out, block=1000)  # many blocks: tokens cross their ends
    on_disk = TextDataModule(**settings, prepared=str(out))
    assert on_disk.tokenizer.to_json() == in_memory.tokenizer.to_json()
    for split in ("train", "val", "test"):
        (tokens, counts), (disk_tokens, disk_counts) = in_memory.splits[split], on_disk.splits[split]
        assert torch.equal(tokens.long(), torch.from_numpy(disk_tokens[:]).long()), split
        assert torch.equal(counts.long(), torch.from_numpy(disk_counts[:]).long()), split

    # make prepare never holds the whole text: it trains the BPE and tokenizes a block at a time.
    with monkeypatch.context() as patch:
        patch.setattr(text, "read_text", lambda *_: pytest.fail("make prepare read the whole text into memory"))
        prepare_main(
            ["--out", str(out), f"--config={CONFIGS / 'default.yaml'}", *BPE, f"--data.init_args.path={folder}"]
        )
    args = [*shrunk_args(tmp_path / "bad"), *BPE, f"--data.init_args.prepared={out}"]
    with user_error(r"data.bpe_vocab_size=400, but data.prepared=.* was prepared with bpe_vocab_size=300"):
        main(["fit", *args, "--data.init_args.bpe_vocab_size=400"])
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow
def test_a_prepared_bpe_run_interrupted_mid_epoch_resumes_exactly_as_in_memory(tmp_path: Path) -> None:
    # Stopped by SIGTERM mid-epoch on the prepared path, its text moved away, resumed: the tensors of
    # an uninterrupted run in memory.
    folder = write_texts(tmp_path / "texts")
    prepare_main(["--out", str(tmp_path / "prepared"), f"--config={CONFIGS / 'default.yaml'}", *BPE,
                  f"--data.init_args.path={folder}"])  # fmt: skip
    common = [*BPE, f"--data.init_args.path={folder}", "--trainer.max_epochs=2", "--test_after_fit=false"]
    common += ["--trainer.deterministic=true"]
    assert_prepared_run_resumes_as_in_memory(tmp_path, common, tmp_path / "prepared", folder, step=13)
{%- endif %}


def test_bpe_is_refused_where_it_cannot_work(tmp_path: Path) -> None:
    with user_error(r"data.bpe_vocab_size must be at least 258"):
        main(["fit", *shrunk_args(tmp_path), *BPE, "--data.init_args.bpe_vocab_size=100"])
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]  # refused before any run folder
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"bpe is trained on plain text .*PromptCompletionDataModule takes bytes"):
        PromptCompletionDataModule(path=str(pairs), tokenizer="bpe")
    untrained = LanguageModel(GPT(vocab_size=300, block_size=8, n_layer=1, n_head=1, n_embd=8), tokenizer="bpe")
    with pytest.raises(CheckpointError, match="load the model from a checkpoint"):
        untrained.tokenizer.decode([1])
{%- if cookiecutter.use_pretrained != "yes" %}


def test_a_tokenizer_other_than_bytes_or_bpe_is_refused_before_the_run(tmp_path: Path) -> None:
    # No pretrained models in this project: a model's name is a clear mistake, not a lookup.
    with user_error(r"data.tokenizer=gpt2: bytes \(null\) or bpe"):
        main(["fit", *shrunk_args(tmp_path), "--data.init_args.tokenizer=gpt2"])
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]
{%- endif %}
