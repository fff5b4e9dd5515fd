"""Fine-tuning a pretrained Hugging Face causal LM (nets.HFCausalLM) offline: LoRA, checkpoints, export, bad input.

No model can be downloaded here: each test uses a 2-layer Llama with random weights and a BPE
tokenizer trained on a small text, saved with ``save_pretrained`` into a temporary folder (the
shape of any model folder or hub snapshot).
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    CONFIGS,
    ROOT,
    assert_ddp_run_resumes_exactly,
    documentation,
{%- if cookiecutter.use_serving != "yes" %}
    greedy_completions,
{%- endif %}
    run_hostile_cases,
    shrunk_args,
    user_error,
)
from test_language_model import assert_cached_decoding_equals_uncached
{%- if cookiecutter.use_serving == "yes" %}
from test_openai_api import assert_decoded_together_equal_alone, harness_or_skip, served_as_run_here
{%- endif %}
from test_preemption import SignalAtStep
from test_resume import EXACT, assert_same_end_state

from {{ cookiecutter.package_name }}.cli import CLI, main
from {{ cookiecutter.package_name }}.commands.generate import main as generate_main
from {{ cookiecutter.package_name }}.commands.predict import main as predict_main
from {{ cookiecutter.package_name }}.data import PromptCompletionDataModule
from {{ cookiecutter.package_name }}.data.prompts import IGNORE
from {{ cookiecutter.package_name }}.data.tokenizer import ChatTemplate, load_tokenizer
from {{ cookiecutter.package_name }}.engine.callbacks.preemption import Preempted
from {{ cookiecutter.package_name }}.engine.errors import DataError
from {{ cookiecutter.package_name }}.engine.inference import load_trained
from {{ cookiecutter.package_name }}.engine.run_folders import run_dir
from {{ cookiecutter.package_name }}.engine.run_records import own_config
from {{ cookiecutter.package_name }}.nets import HFCausalLM, LoRA

transformers = pytest.importorskip("transformers", reason="the finetune extra (make install installs it)")
pytest.importorskip("peft", reason="the finetune extra (make install installs it)")

FINETUNE = CONFIGS / "experiments" / "finetune.yaml"
SFT = CONFIGS / "experiments" / "finetune-sft.yaml"
TEXT = "The whale swam past the ship. The sailors watched the sea and the sky. " * 200
HIDDEN, LAYERS, RANK = 32, 2, 4
SHORT = ["--trainer.limit_train_batches=2", "--trainer.log_every_n_steps=1"]  # two steps: enough to write checkpoints


def save_tiny_llama(
    folder: Path, vocab_size: int = 300, seed: int = 0, context: int = 64, chat_template: str | None = None
) -> Path:
    """A 2-layer Llama (random weights) and a byte-level BPE tokenizer trained on TEXT (with ``chat_template``),
    saved by ``save_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([TEXT], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.chat_template = chat_template
    fast.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        bos_token_id=fast.eos_token_id,
        eos_token_id=fast.eos_token_id,
        # Larger than Llama's 0.02: a random output layer that small caps every logit near 0, so no
        # adapter could make a prediction confident, and "the loss falls" would test nothing.
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def finetune_args(tmp_path: Path, model: Path, text: Path | None = None) -> list[str]:
    """The shrunk test config with configs/experiments/finetune.yaml stacked on it, on ``model`` and TEXT."""
    if text is None:
        text = tmp_path / "text.txt"
        text.parent.mkdir(parents=True, exist_ok=True)
        text.write_text(TEXT)
    return [
        *shrunk_args(tmp_path),
        f"--config={FINETUNE}",
        f"--model.init_args.net.init_args.model={model}",
        f"--data.init_args.tokenizer={model}",
        f"--data.init_args.path={text}",
        "--model.init_args.net.init_args.lora.r=4",
        "--model.init_args.net.init_args.lora.dropout=0.0",
        "--data.init_args.block_size=32",
        "--data.init_args.val_fraction=0.1",
        "--data.init_args.test_fraction=0.1",
        "--trainer.max_steps=-1",
        "--trainer.limit_train_batches=10",
        "--trainer.val_check_interval=10",
        "--trainer.log_every_n_steps=5",
    ]


@pytest.fixture(scope="module")
def lora_run(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[CLI, dict]:
    """One LoRA fine-tuning of the tiny model (50 steps), shared by the tests that read its results."""
    args = finetune_args(tmp_path_factory.mktemp("lora"), tiny)
    cli = main(["fit", *args, "--trainer.max_epochs=5", "--model.init_args.optimizer.init_args.lr=0.05"])
    return cli, json.loads((run_dir(cli.trainer) / "test_metrics.json").read_text())


def test_lora_trains_only_the_adapters_and_its_checkpoint_holds_only_them(
    tiny: Path, lora_run: tuple[CLI, dict]
) -> None:
    cli, summary = lora_run
    net = cli.model.net
    trainable = {name: p.numel() for name, p in net.named_parameters() if p.requires_grad}
    # q, k, v and o projections of 2 layers, each A (r x in) and B (out x r); k and v are 16 wide (2 KV heads).
    per_layer = sum(RANK * (HIDDEN + out) for out in (HIDDEN, 16, 16, HIDDEN))
    assert sum(trainable.values()) == LAYERS * per_layer == 1792
    assert all("lora_" in name for name in trainable)

    checkpoint = torch.load(summary["checkpoint"], map_location="cpu", weights_only=True)
    saved = checkpoint["state_dict"]
    weights = {key for key, value in saved.items() if key.startswith("net.") and isinstance(value, torch.Tensor)}
    assert weights == {f"net.{name}" for name in trainable}  # the adapters, not the base
    record = saved["net._extra_state"]
    assert record["base"]["model"] == str(tiny) and len(record["base"]["sha256"]) == 64
    assert record["lora"] == {
        "r": 4,
        "alpha": 16,
        "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    # The loss falls on the repeated text: from ln(vocabulary) for random weights to far below.
    assert summary["metrics"]["test/loss"] < 0.5 * math.log(300)
    # Bits per byte: the same total nats over the test text's bytes rather than its tokens.
    data = cli.datamodule
    tokens, counts = data.splits["test"]
    windows = (len(tokens) - 1) // 32
    tokens_per_byte = windows * 32 / counts[1 : windows * 32 + 1].sum().item()
    expected = summary["metrics"]["test/loss"] / math.log(2) * tokens_per_byte
    assert summary["metrics"]["test/bpb"] == pytest.approx(expected, rel=0.02)

    # The checkpoint alone rebuilds the base from its folder and the adapters: generate{{ " and serve" if cookiecutter.use_serving == "yes" else "" }} answer{{ "" if cookiecutter.use_serving == "yes" else "s" }}.
    trained = load_trained(summary["checkpoint"])
    (completion,) = {{ 'trained.model.infer(trained.predictor, trained.datamodule.inputs_from_json(["The whale"]))' if cookiecutter.use_serving == "yes" else 'greedy_completions(trained, ["The whale"])' }}
    assert isinstance(completion, str) and completion
    assert "sea" in completion or "ship" in completion or "whale" in completion  # it learnt the text's words


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the gpu preset)")
def test_gpu_preset_fine_tunes_with_lora_in_mixed_precision(tiny: Path, tmp_path: Path) -> None:
    # bf16-mixed (16-mixed without bfloat16): the base runs in half precision, the adapters train in float32.
    gpu = [f"--config={CONFIGS / 'presets' / 'gpu.yaml'}", "--trainer.accelerator=gpu"]
    args = finetune_args(tmp_path, tiny)
    cli = main(["fit", *args, *gpu, "--trainer.max_epochs=5", "--model.init_args.optimizer.init_args.lr=0.05"])
    summary = json.loads((run_dir(cli.trainer) / "test_metrics.json").read_text())
    assert summary["metrics"]["test/loss"] < 0.5 * math.log(300)  # as on the CPU, in float32
    assert {p.dtype for p in cli.model.net.parameters() if p.requires_grad} == {torch.float32}
    # The checkpoint holds the adapters alone and loads on a machine without a GPU.
    trained = load_trained(summary["checkpoint"], map_location="cpu")
    (completion,) = {{ 'trained.model.infer(trained.predictor, trained.datamodule.inputs_from_json(["The whale"]))' if cookiecutter.use_serving == "yes" else 'greedy_completions(trained, ["The whale"])' }}
    assert isinstance(completion, str) and completion


def test_cached_generation_of_a_pretrained_model_equals_uncached(tiny: Path) -> None:
    # transformers' own key/value cache (use_cache=True), past the model's 64-position context too.
    net = HFCausalLM(model=str(tiny), lora=None, block_size=24).eval()
    prompt = torch.randint(0, 250, (2, 5), generator=torch.Generator().manual_seed(0))  # (B, T0) token ids
    with torch.no_grad():
        assert_cached_decoding_equals_uncached(net, prompt, new_tokens=30)
{%- if cookiecutter.use_serving == "yes" %}


@pytest.mark.parametrize("prefill_tokens", [4, 64])
@pytest.mark.parametrize("kind", ["llama", "llama with LoRA", "gpt2", "sliding window", "cache of another kind"])
def test_answers_of_a_pretrained_model_decoded_together_equal_each_decoded_alone(
    kind: str, prefill_tokens: int, tiny: Path, tmp_path: Path
) -> None:
    """Llama (rotary positions; also under peft's LoRA) and GPT-2 (learnt positions) share one forward pass a step,
    their rows padded and masked (prompts prefilled in chunks, or together); a model with sliding-window layers,
    whose cache cannot be padded here, decodes each answer alone, and so does one whose cache turns out to be of
    another kind than its config says (sharing switched off at the first join)."""
    folder, lora = tiny, LoRA(r=4, dropout=0.0) if kind == "llama with LoRA" else None
    if kind == "gpt2":
        folder = save_tiny_gpt2(tmp_path / "gpt2")
    elif not kind.startswith("llama"):
        config = transformers.MistralConfig(
            vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, sliding_window=8,
        )  # fmt: skip
        folder = tmp_path / "mistral"
        transformers.MistralForCausalLM(config).save_pretrained(folder)
    net = HFCausalLM(model=str(folder), lora=lora, block_size=24).eval()
    if kind == "cache of another kind":
        net.__dict__["_full_attention"] = True  # as if its config named full attention alone
    # Weights spread (norms kept; LoRA's B too, which starts at 0): a fresh GPT-2's tokens mostly repeat the last one.
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, parameter in net.named_parameters():
            if "norm" not in name and "ln_" not in name:
                parameter.normal_(0.0, 0.3, generator=generator)
    shared_steps, prefilled_together = assert_decoded_together_equal_alone(net, prefill_tokens)
    if kind in ("llama", "llama with LoRA", "gpt2"):
        assert shared_steps >= 15 and prefilled_together == (2 if prefill_tokens == 64 else 0)
    else:  # the other kind of cache shows at the first answer's join: sharing is off before any pair comes
        assert shared_steps == 0 and prefilled_together == 0
{%- endif %}


def test_full_finetuning_trains_and_saves_every_weight(tiny: Path, tmp_path: Path) -> None:
    full = tmp_path / "full.yaml"  # as a user writes it: lora: null in their config
    full.write_text("model:\n  init_args:\n    net:\n      init_args:\n        lora: null\n")
    args = [*finetune_args(tmp_path, tiny), f"--config={full}", "--test_after_fit=false"]
    cli = main(["fit", *args, *SHORT, "--trainer.limit_val_batches=1"])
    net = cli.model.net
    assert all(p.requires_grad for p in net.parameters())
    saved = torch.load(run_dir(cli.trainer) / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    weights = {key for key, value in saved.items() if key.startswith("net.") and isinstance(value, torch.Tensor)}
    assert weights == {f"net.{key}" for key in net.state_dict()} - {"net._extra_state"}
    assert len(weights) > 20  # every weight of the 2-layer Llama


@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_lora_resumes_exactly_after_sigterm_mid_epoch(tiny: Path, tmp_path: Path) -> None:
    reference = main(["fit", *finetune_args(tmp_path / "reference", tiny), *EXACT])
    args = [*finetune_args(tmp_path / "resumed", tiny), *EXACT]
    interrupted = main(args, run=False)
    interrupted.trainer.callbacks.append(SignalAtStep(step=14, name="SIGTERM"))  # 10 steps an epoch: mid epoch 2
    with pytest.raises(Preempted):
        interrupted.trainer.fit(interrupted.model, datamodule=interrupted.datamodule)
    # As the interrupt says: the run's own config (finetune.yaml's net is in it), nothing else.
    resumed = main(["fit", f"--config={own_config(run_dir(interrupted.trainer))}", "--resume=true"])
    assert_same_end_state(reference, resumed)
    # The frozen base is rebuilt from its folder on resume: equal to the uninterrupted run's too.
    for (name, expected), (_, actual) in zip(
        reference.model.net.named_parameters(), resumed.model.net.named_parameters(), strict=True
    ):
        assert torch.equal(expected, actual), name


@pytest.mark.slow
def test_lora_under_ddp_stopped_by_sigterm_resumes_exactly(tiny: Path, tmp_path: Path) -> None:
    # Two processes (gloo), 5 steps an epoch each (10 batches), 3 epochs; SIGTERM after step 12, saved at
    # step 13 (the processes agree a step late), mid third epoch.
    args_for = lambda folder: [*finetune_args(folder, tiny), *EXACT]  # noqa: E731
    interrupted = assert_ddp_run_resumes_exactly(tmp_path, args_for, step=12)
    saved = torch.load(interrupted, weights_only=True)
    assert "net._extra_state" in saved["state_dict"]  # adapters only, under DDP too
{%- if cookiecutter.use_serving == "yes" %}


def test_merged_export_loads_in_transformers_alone_and_equals_the_unmerged_model(
    lora_run: tuple[CLI, dict], tmp_path: Path
) -> None:
    from {{ cookiecutter.package_name }}.commands.export import main as export_main

    _, summary = lora_run
    export_main(["--ckpt", summary["checkpoint"], "--output", str(tmp_path / "export"), "--onnx", "false"])
    folder = tmp_path / "export" / "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in folder.iterdir()}
    merged = transformers.AutoModelForCausalLM.from_pretrained(folder)  # no project code, no peft
    trained = load_trained(summary["checkpoint"])
    tokens = torch.tensor([trained.datamodule.tokenizer.encode(TEXT[:200])[:32]])
    with torch.no_grad():
        difference = (merged(input_ids=tokens).logits - trained.model.net(tokens)).abs().max().item()
    adapter = trained.model.net.model.base_model.model.model.layers[0].self_attn.q_proj.lora_B.default.weight
    assert adapter.abs().max() > 0  # trained: the merge changed the weights
    assert difference < 1e-4
    record = json.loads((tmp_path / "export" / "export.json").read_text())
    assert record["max_abs_diff"]["hf"]["batch_1"] < 1e-4 and record["files"]["hf"] == "hf"
{%- endif %}


def test_generate_and_predict_continue_prompts_from_the_checkpoint_alone(
    lora_run: tuple[CLI, dict], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, summary = lora_run
    capsys.readouterr()
    generate_main(["--ckpt", summary["checkpoint"], "--prompt", "The whale", "--max_new_tokens", "20"])
    text = capsys.readouterr().out
    assert text.startswith("The whale") and len(text) > len("The whale") + 10
    # make predict INPUTS=prompts.txt: a prompt per line, each continued by the model's own tokens.
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The whale\nThe sailors watched\n")
    predict_main(["--ckpt", summary["checkpoint"], "--inputs", str(prompts), "--output", str(tmp_path / "out.jsonl")])
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == ["The whale", "The sailors watched"]
    assert all(isinstance(row["completion"], str) and row["completion"] for row in rows)


def SFT_ARGS(model: Path) -> list[str]:  # noqa: N802 -- read as a constant
    """What finetune-sft.yaml sets that the tiny model needs otherwise: its tokenizer, a block within its context."""
    return [f"--data.init_args.tokenizer={model}", "--data.init_args.block_size=32"]


def write_pairs(path: Path, pairs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return path


PAIRS = [{"prompt": f"Q: what does the {w} do?\nA:", "completion": f" the {w} swims."} for w in ("whale", "eel", "cod")]


def test_prompt_completion_examples_score_the_completion_only(tiny: Path, tmp_path: Path) -> None:
    data = PromptCompletionDataModule(str(write_pairs(tmp_path / "pairs.jsonl", PAIRS * 10)), tokenizer=str(tiny))
    data.setup("fit")
    inputs, targets, counts = data.train_set[0]
    prompt = data.tokenizer.encode(PAIRS[0]["prompt"])
    scored = targets != IGNORE
    assert not scored[: len(prompt) - 1].any() and scored[len(prompt) - 1 :].all()
    # The scored targets are the completion and the end-of-text token; their bytes are the completion's.
    completion = [*data.tokenizer.encode(PAIRS[0]["completion"]), data.tokenizer.eos_id]
    assert targets[scored].tolist() == completion
    assert counts.sum().item() == len(PAIRS[0]["completion"].encode())
    batch = data.collate_fn([data.train_set[0], data.train_set[1], (inputs[:3], targets[:3], counts[:3])])
    assert batch[0].shape == batch[1].shape == (3, max(len(inputs), len(data.train_set[1][0])))
    assert (batch[1][2, 3:] == IGNORE).all() and (batch[2][2, 3:] == 0).all()  # padding is never scored


def test_supervised_finetuning_learns_the_completions(tiny: Path, tmp_path: Path) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS * 20)
    args = [*finetune_args(tmp_path, tiny), f"--config={SFT}", f"--data.init_args.path={pairs}", *SFT_ARGS(tiny)]
    args += ["--data.init_args.batch_size=4", "--trainer.max_epochs=4"]
    cli = main(["fit", *args, "--model.init_args.optimizer.init_args.lr=0.02"])
    summary = json.loads((run_dir(cli.trainer) / "test_metrics.json").read_text())
    assert summary["metrics"]["test/loss"] < 1.0  # from ln(300) = 5.7 nats per completion token
    trained = load_trained(summary["checkpoint"])
    answers = {{ 'trained.model.infer(trained.predictor, trained.datamodule.inputs_from_json([PAIRS[0]["prompt"]]))' if cookiecutter.use_serving == "yes" else 'greedy_completions(trained, [PAIRS[0]["prompt"]])' }}
    assert answers == [PAIRS[0]["completion"]]  # greedy decoding stops at the end-of-text token


def test_a_checkpoint_refuses_a_base_whose_weights_changed(tiny: Path, tmp_path: Path) -> None:
    base = save_tiny_llama(tmp_path / "base")
    cli = main(["fit", *finetune_args(tmp_path, base), *SHORT, "--test_after_fit=false"])
    checkpoint = run_dir(cli.trainer) / "checkpoints" / "last.ckpt"
    save_tiny_llama(base, seed=1)  # the same folder, other weights
    with pytest.raises(ValueError, match=r"trained on .*base.* with other weights"):
        load_trained(checkpoint)


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "extra.bin")  # the fingerprint's read of it would never end
    return r"extra\.bin is not a regular file"


def _link_out(folder: Path) -> str:
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/etc/hostname")
    return r"model\.safetensors leads out of .* \(to /etc/hostname\)"


def _index_out(folder: Path) -> str:
    shutil.copy(folder / "model.safetensors", folder.parent / "outside.safetensors")
    outside = {"lm_head.weight": "../outside.safetensors"}
    weight_map = {"weight_map": outside}
    (folder / "model.safetensors.index.json").write_text(json.dumps(weight_map))
    return r"index\.json names the weight file '\.\./outside\.safetensors', which is not a file of"


def _declares_more(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=1024, intermediate_size=4096)  # the same tensors, each far larger than stored
    (folder / "config.json").write_text(json.dumps(config))
    return r"holds weights for [\d,]+ numbers, but its config.json declares a model of 2[\d,]{9} parameters"


def _declares_a_million_layers(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))  # minutes to build
    return r"config.json declares a model of more than [\d,]+ weight tensors, but its files hold [\d,]+"


def _declares_a_layer_more(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": LAYERS + 1}))
    return r"weights do not fit the model its config.json declares: 9 tensor\(s\) missing or of another shape"


def _wrong_type(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "use_cache": "os.system"}))
    return r"(holds no tokenizer transformers can read|is not a complete causal language model) \(\w+: "


@pytest.mark.parametrize(
    "spoil",
    [_fifo, _link_out, _index_out, _declares_more, _declares_a_million_layers, _declares_a_layer_more, _wrong_type],
    ids=["FIFO", "symlink out", "index out", "weights missing", "a million layers", "a layer more", "wrong type"],
)
def test_a_model_folder_is_read_through_its_own_regular_files_only(tiny: Path, tmp_path: Path, spoil) -> None:
    # A downloaded folder is data: what it makes the loader read is refused in one line, before anything reads it.
    folder = tmp_path / "model"
    shutil.copytree(tiny, folder)
    message = spoil(folder)
    with user_error(rf"^(data\.tokenizer|net\.model): {re.escape(str(folder))}.*{message}"):
        main(["fit", *finetune_args(tmp_path, folder), *SHORT])


MODEL_FOLDER_FIELDS = textwrap.dedent(
    """
    import json, resource, shutil, sys
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
    from {{ cookiecutter.package_name }}.engine.errors import UserError
    from {{ cookiecutter.package_name }}.nets import HFCausalLM

    base, work = Path(sys.argv[3]), Path(sys.argv[3]).with_name("case")
    config = json.loads((base / "config.json").read_text())
    for case in json.loads(open(sys.argv[1]).read()):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        (work / "config.json").write_text(json.dumps({**config, case["field"]: case["value"]}))
        try:
            HFCausalLM(str(work))
            outcome = "ran"
        except UserError as error:
            outcome = "refused" if "\\n" not in str(error) else "refused over several lines"
        except Exception as error:  # a traceback: not a one-line refusal
            outcome = f"traceback {type(error).__name__}: {str(error)[:120]}"
        print(json.dumps({"field": case["field"], "label": case["label"], "outcome": outcome}), flush=True)
    """
)


@pytest.mark.slow  # about 250 loads of the tiny Llama, in one process under a memory limit
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS: Linux")
def test_every_field_of_a_model_folders_config_is_data(tiny: Path, tmp_path: Path) -> None:
    # Each field of a real config.json is replaced in turn by each hostile value and the folder loaded as a
    # net: nothing may take memory past the limit or hang (the timeout), and a refusal is one line.
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    hostile = {"class spec": {"class_path": "os.system", "init_args": dict(command="id")}, "dotted function": "x.y"}
    hostile |= {"huge": 2**40, "negative": -5, "float": 0.5, "deep nesting": deep, "text": "x", "null": None}
    hostile["list"] = [1, 2]
    fields = json.loads((tiny / "config.json").read_text())
    cases = [{"field": field, "label": label, "value": value} for field in fields for label, value in hostile.items()]
    shutil.copytree(tiny, tmp_path / "base")
    limit = 6 << 30  # bytes of address space: a config of 2**40 positions or vocabulary rows made whole takes more
    results = run_hostile_cases(MODEL_FOLDER_FIELDS, cases, tmp_path, limit, str(tmp_path / "base"))
    assert len(results) == len(cases) > 100
    loud = [r for r in results if not r["outcome"].startswith(("ran", "refused"))]
    assert loud == [], "\n".join(f"{r['field']} = {r['label']}: {r['outcome']}" for r in loud[:30])
    print(f"{len(results)} cases: {sum(r['outcome'] == 'ran' for r in results)} loaded, the rest refused in one line")


def adapter_gradients(net: HFCausalLM, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of predicting ``tokens`` (B, T) shifted by one, and the gradient of each trainable parameter."""
    net.zero_grad()
    logits = net(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in net.named_parameters() if p.requires_grad}


def test_gradient_checkpointing_gives_the_same_loss_and_adapter_gradients(tiny: Path) -> None:
    tokens = torch.randint(0, 290, (2, 17), generator=torch.Generator().manual_seed(0))
    results, calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same adapter initialisation
        net = HFCausalLM(str(tiny), lora=LoRA(r=4, dropout=0.0), gradient_checkpointing=checkpointing)
        for name, parameter in net.named_parameters():
            if "lora_B" in name:  # zero at initialisation, which would leave every lora_A gradient zero
                parameter.data.fill_(0.1)
        # The first layer inside the checkpointed block (torch's recomputation stops early once the
        # tensors the backward pass needs are back, so later ones may not run twice).
        query = net.model.base_model.model.model.layers[0].self_attn.q_proj
        calls.append(0)
        query.register_forward_hook(lambda *_: calls.__setitem__(-1, calls[-1] + 1))
        results.append(adapter_gradients(net, tokens))
    assert calls == [1, 2]  # checkpointed: the block runs again in the backward pass
    (loss, gradients), (checkpointed_loss, checkpointed_gradients) = results
    assert torch.allclose(loss, checkpointed_loss)
    assert gradients.keys() == checkpointed_gradients.keys() and len(gradients) == 8  # A and B of q, v in 2 layers
    for name, gradient in gradients.items():
        assert gradient.abs().sum() > 0, name  # reached the adapters through the checkpointed layers
        assert torch.allclose(gradient, checkpointed_gradients[name], atol=1e-6), name


def test_a_bfloat16_base_trains_float32_adapters_and_full_finetuning_refuses_it(tiny: Path) -> None:
    net = HFCausalLM(str(tiny), lora=LoRA(r=4, dropout=0.0), base_dtype="bfloat16")
    dtypes = {p.dtype for p in net.parameters() if not p.requires_grad}
    assert dtypes == {torch.bfloat16}  # half the memory of the frozen base
    assert {p.dtype for p in net.parameters() if p.requires_grad} == {torch.float32}
    loss, gradients = adapter_gradients(net, torch.randint(0, 290, (2, 17)))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in gradients.values())
    with pytest.raises(ValueError, match=r"net\.base_dtype=bfloat16 without LoRA would train bfloat16 weights"):
        HFCausalLM(str(tiny), lora=None, base_dtype="bfloat16")


def save_tiny_gpt2(folder: Path, chat_template: str | None = None) -> Path:
    """A 2-layer GPT-2 (random weights) with the tiny Llama's tokenizer (and ``chat_template``), as a model folder."""
    config = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer = save_tiny_llama(folder.with_name(folder.name + "-tokenizer"), chat_template=chat_template)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tokenizer / name).is_file():
            (folder / name).write_bytes((tokenizer / name).read_bytes())
    return folder


def test_lora_on_a_gpt2_folder_adapts_its_conv1d_layers_without_a_warning(tmp_path: Path) -> None:
    # GPT-2 keeps its projections in Conv1D layers (weight (in, out)); peft warned about
    # fan_in_fan_out on every fine-tune command (an error under this suite's filterwarnings).
    folder = save_tiny_gpt2(tmp_path / "gpt2")
    net = HFCausalLM(str(folder), lora=LoRA(r=4, dropout=0.0, target_modules=["c_attn"]))
    assert net.model.peft_config["default"].fan_in_fan_out
    loss, gradients = adapter_gradients(net, torch.randint(0, 290, (2, 17)))
    assert torch.isfinite(loss) and len(gradients) == 4  # A and B of c_attn in 2 layers


def test_lora_target_modules_the_model_lacks_are_listed(tiny: Path) -> None:
    listed = "no layer named qkv; its layers with a weight matrix are: down_proj, embed_tokens, gate_proj, k_proj"
    with pytest.raises(ValueError, match=listed):
        HFCausalLM(str(tiny), lora=LoRA(target_modules=["qkv"]))


@pytest.mark.parametrize(
    "case",
    [
        *("no model", "not cached", "no weights", "custom code", "pickled weights", "other tokenizer"),
        *("big tokenizer", "no key", "long prompt", "bad target"),
    ],
)
def test_bad_finetuning_input_is_one_line_before_anything_is_written(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    args = finetune_args(tmp_path, tiny)
    pairs = tmp_path / "pairs.jsonl"
    if case == "no model":
        args += [f"--model.init_args.net.init_args.model={tmp_path / 'nowhere'}"]
        expected = "does not exist"
    elif case == "not cached":
        args += ["--model.init_args.net.init_args.model=someone/some-model"]
        expected = r"nor in the local Hugging Face cache .* `hf download someone/some-model`"
    elif case == "no weights":
        incomplete = tmp_path / "incomplete"
        incomplete.mkdir()
        (incomplete / "config.json").write_text((tiny / "config.json").read_text())
        args += [f"--model.init_args.net.init_args.model={incomplete}"]
        expected = "is not a complete causal language model"
    elif case == "custom code":  # transformers would ask "run the custom code? [y/N]" on a terminal
        custom = shutil.copytree(tiny, tmp_path / "custom")
        config = json.loads((custom / "config.json").read_text())
        config.update(model_type="labllama", auto_map={"AutoModelForCausalLM": "labcode.LabModel"})
        (custom / "config.json").write_text(json.dumps(config))
        (custom / "labcode.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
        args += [f"--model.init_args.net.init_args.model={custom}", f"--data.init_args.tokenizer={custom}"]
        expected = r"maps model_type 'labllama' to Python code in the folder \(auto_map\), which .* never runs"
    elif case == "pickled weights":
        pickled = shutil.copytree(tiny, tmp_path / "pickled", ignore=shutil.ignore_patterns("*.safetensors"))
        torch.save(transformers.AutoModelForCausalLM.from_pretrained(tiny).state_dict(), pickled / "pytorch_model.bin")
        args += [f"--model.init_args.net.init_args.model={pickled}"]
        expected = r"holds its weights as a pickle \(pytorch_model.bin\), .* only .safetensors are loaded"
    elif case == "other tokenizer":
        other = save_tiny_llama(tmp_path / "other", vocab_size=290)
        args += [f"--data.init_args.tokenizer={other}"]
        expected = "has another vocabulary than the net's model"
    elif case == "big tokenizer":  # the model's tokenizer with tokens added, the model not resized
        tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
        tokenizer.add_tokens([f"<extra-{i}>" for i in range(10)])
        tokenizer.save_pretrained(tmp_path / "bigger")
        (tmp_path / "bigger" / "config.json").write_text((tiny / "config.json").read_text())
        args += [f"--data.init_args.tokenizer={tmp_path / 'bigger'}"]
        expected = r"has \d+ tokens, more than the \d+ rows"
    elif case == "no key":
        write_pairs(pairs, [*PAIRS, {"prompt": "Q: what?"}])
        args += [f"--config={SFT}", f"--data.init_args.path={pairs}", *SFT_ARGS(tiny)]
        expected = rf'{pairs} line 4 needs the strings "prompt" and "completion"'
    elif case == "long prompt":
        write_pairs(pairs, [*PAIRS, {"prompt": "the whale " * 40, "completion": " swims."}])
        args += [f"--config={SFT}", f"--data.init_args.path={pairs}", *SFT_ARGS(tiny)]
        expected = r"line 4: the prompt has \d+ tokens; with its completion it must fit in data.block_size = 32"
    else:
        args += ["--model.init_args.net.init_args.lora.target_modules=[qkv]"]
        expected = "has no layer named qkv; its layers with a weight matrix are"
    with user_error(expected):
        main(["fit", *args])
    assert not [file for file in (tmp_path / "logs").rglob("*") if file.is_file()]  # no run folder, no file
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow
def test_the_readme_fine_tunes_offline_as_written(tmp_path: Path) -> None:
    """The README's "Fine-tune a pretrained model" commands, run as written in a copy of the project.

    `hf download` is the one command not run (no internet): the test puts a tiny Llama in a
    Hugging Face cache of its own under the id the README and finetune.yaml name, as the download would.
    One change a user could make too keeps it short: the copy's finetune.yaml trains 20 steps on
    64-token windows and validates on 10 batches.
    """
    section = documentation().split("## Fine-tune a pretrained model", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in section.split("```bash", 1)[1].split("```", 1)[0].splitlines()]
    commands = [command for command in commands if command]
    download, *rest = commands
    model_id = download.removeprefix("hf download ").strip()
    config = yaml.safe_load(FINETUNE.read_text())
    assert config["model"]["init_args"]["net"]["init_args"]["model"] == model_id
    assert config["data"]["init_args"]["tokenizer"] == model_id
    assert [command.split()[1] for command in rest] == ["train", "generate"{{ ', "export"' if cookiecutter.use_serving == "yes" else "" }}]

    cache = tmp_path / "hf-cache"
    repo = cache / f"models--{model_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    save_tiny_llama(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    project = tmp_path / "project"
    shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns(".venv", "logs", ".git", "wandb", "__pycache__"))
    short = project / "configs" / "experiments" / "finetune.yaml"
    text = short.read_text()
    for setting, value in (("max_steps: 300", "max_steps: 20"), ("val_check_interval: 50", "val_check_interval: 10")):
        assert setting in text
        text = text.replace(setting, f"{value}\n  limit_val_batches: 10" if "val_check" in setting else value)
    short.write_text(text.replace("block_size: 256", "block_size: 64"))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("PYTEST_ADDOPTS", None)
    outputs = []
    for command in rest:
        done = subprocess.run(
            ["bash", "-c", f"{command} PYTHON={sys.executable}"], cwd=project, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    run = max((project / "logs").glob("*/finetune-*"), key=lambda folder: folder.stat().st_mtime)
    summary = json.loads((run / "test_metrics.json").read_text())
    assert summary["global_step"] == 20 and math.isfinite(summary["metrics"]["test/bpb"])
    assert "\nCall me Ishmael." in outputs[1]  # after the command make echoes
{%- if cookiecutter.use_serving == "yes" %}
    assert re.search(r"export/hf: max abs diff from PyTorch batch_1 \S+", outputs[2])
    assert (run / "export" / "hf" / "model.safetensors").is_file()
{%- endif %}


# A chat template as transformers reads it (Jinja), put together from pieces: this file is itself a template.
OPEN, CLOSE, SAY, SAID = "{" + "%", "%" + "}", "{" * 2, "}" * 2
CHAT_TEMPLATE = (
    f"{OPEN} for m in messages {CLOSE}<|{SAY} m.role {SAID}|>{SAY} m.content {SAID}<|endoftext|>{OPEN} endfor {CLOSE}"
    f"{OPEN} if add_generation_prompt {CLOSE}<|assistant|>{OPEN} endif {CLOSE}"
)
CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"The {w}?"},
            {"role": "assistant", "content": f"The {w} swims."},
            {"role": "user", "content": "And then?"},
            {"role": "assistant", "content": "It dives."},
        ]
    }
    for w in ("whale", "eel", "cod")
]


def test_chat_examples_score_the_assistant_turns_only(tmp_path: Path) -> None:
    folder = save_tiny_llama(tmp_path / "chat-model", chat_template=CHAT_TEMPLATE)
    rows = write_pairs(tmp_path / "chats.jsonl", CHATS[:1] * 9)
    for tokenizer, ends in ((str(folder), "<|endoftext|>"), (None, "\n")):  # the model's template; bytes, the plain one
        data = PromptCompletionDataModule(str(rows), tokenizer=tokenizer, block_size=200, batch_size=2)
        data.setup("fit")
        inputs, targets, counts = data.train_set[0]
        scored = targets != IGNORE
        # What the loss sees: the assistant's two answers, each with the template's end of turn, and nothing else.
        assert data.tokenizer.decode(targets[scored].tolist()) == f"The whale swims.{ends}It dives.{ends}"
        assert targets[scored].tolist().count(data.tokenizer.eos_id) == 2  # each turn ends with end-of-text
        assert not scored[: (targets != IGNORE).nonzero()[0].item()].any() and counts[~scored].sum() == 0
        prompt = ChatTemplate(data.tokenizer).ids(CHATS[0]["messages"][:2])  # what {{ "make serve sends the model" if cookiecutter.use_serving == "yes" else "a chat prompts the model with" }}
        assert inputs[: len(prompt)].tolist() == prompt


def test_a_model_folders_chat_template_that_loops_without_end_is_stopped(tmp_path: Path) -> None:
    """A model folder is data: its Jinja template runs in transformers' sandbox, which does not bound loops."""
    spin = f"{OPEN} for i in range(99999) {CLOSE}{OPEN} for j in range(99999) {CLOSE}{OPEN} endfor {CLOSE}"
    spin += f"{OPEN} endfor {CLOSE}"
    folder = save_tiny_llama(tmp_path / "spinning", chat_template=spin + CHAT_TEMPLATE)
    template = ChatTemplate(load_tokenizer(str(folder)))
    with pytest.raises(ValueError, match=r"^the chat template ran over 1000000 steps; use a template that loops"):
        template.ids(CHATS[0]["messages"][:2])  # without the bound: about 10**10 loop turns
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__  # the trace is gone again
    fine = ChatTemplate(load_tokenizer(str(save_tiny_llama(tmp_path / "fine", chat_template=CHAT_TEMPLATE))))
    assert fine.render(CHATS[0]["messages"][:2]).endswith("<|assistant|>")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        ({"messages": [{"role": "pirate", "content": "arr"}, {"role": "assistant", "content": "x"}]}, "is 'pirate'"),
        ({"messages": [{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "x"}]}, "must be text"),
        ({"messages": [{"role": "user", "content": "w" * 400}, {"role": "assistant", "content": "x"}]}, "beyond"),
        ({"messages": "hi"}, 'a "messages" list'),
    ],
)
def test_a_bad_chat_row_is_one_line_naming_it(row: dict, message: str, tmp_path: Path) -> None:
    rows = write_pairs(tmp_path / "chats.jsonl", [*CHATS, row])
    with pytest.raises(DataError, match=rf"chats\.jsonl line 4\b.*{re.escape(message)}") as refused:
        PromptCompletionDataModule(str(rows), block_size=200, batch_size=1).setup("fit")
    assert "\n" not in str(refused.value)
{%- if cookiecutter.use_serving == "yes" %}


@pytest.mark.slow
def test_a_chat_lora_finetune_answers_through_the_openai_api_as_trained(tmp_path: Path) -> None:
    folder = save_tiny_llama(tmp_path / "chat-model", chat_template=CHAT_TEMPLATE, context=128)
    rows = write_pairs(tmp_path / "chats.jsonl", CHATS * 20)
    args = [*finetune_args(tmp_path, folder), f"--config={SFT}", f"--data.init_args.path={rows}", *SFT_ARGS(folder)]
    args += ["--data.init_args.block_size=128", "--data.init_args.batch_size=4", "--trainer.max_epochs=4"]
    cli = main(["fit", *args, "--model.init_args.optimizer.init_args.lr=0.02"])
    trained = load_trained(cli.trainer.checkpoint_callback.best_model_path)
    question = CHATS[0]["messages"][:2]
    rendered = trained.model.chat_template().render(question)
    assert rendered.endswith("<|user|>The whale?<|endoftext|><|assistant|>")
    answer = served_as_run_here(trained, question, max_tokens=20, folder=tmp_path)
    assert answer == ("The whale swims.", "stop")  # it learnt the answer, and to end its turn


@pytest.mark.slow
def test_a_gpt2_lora_chat_finetune_is_served_from_its_checkpoint_adapters(tmp_path: Path) -> None:
    """GPT-2 (Conv1D projections, learnt positions) as the OpenAI API serves it: the server's answers are
    those of the checkpoint's adapters on the base folder, run here."""
    folder = save_tiny_gpt2(tmp_path / "gpt2", chat_template=CHAT_TEMPLATE)
    rows = write_pairs(tmp_path / "chats.jsonl", CHATS * 4)
    args = [*finetune_args(tmp_path, folder), f"--config={SFT}", f"--data.init_args.path={rows}", *SFT_ARGS(folder)]
    args += ["--data.init_args.block_size=64", "--data.init_args.batch_size=4", "--trainer.max_epochs=1"]
    cli = main(["fit", *args, "--model.init_args.net.init_args.lora.target_modules=[c_attn]"])
    checkpoint = cli.trainer.checkpoint_callback.best_model_path
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    weights = {key: value for key, value in saved.items() if key.startswith("net.") and isinstance(value, torch.Tensor)}
    assert len(weights) == 4 and all("c_attn.lora_" in key for key in weights), sorted(weights)  # no base weights
    assert all(weights[key].abs().sum() > 0 for key in weights if "lora_B" in key)  # trained (B starts at 0)
    trained = load_trained(checkpoint)
    served_as_run_here(trained, CHATS[1]["messages"][:2], max_tokens=12, folder=tmp_path)  # chat and scores
    harness_or_skip()  # lm-evaluation-harness through the model's own tokenizer (/tokenize), on a few examples
    command = ["make", "--no-print-directory", "eval", f"PYTHON={sys.executable}", f"CKPT={checkpoint}"]
    command += [f"ARGS=--output {tmp_path / 'eval'} --limit 4"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (results,) = (tmp_path / "eval").rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]
    assert 0 <= scores["moby_dick_continuations"]["acc,none"] <= 1 and "exact_match,none" in scores["moby_dick_words"]
{%- endif %}
