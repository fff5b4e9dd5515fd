"""Training images/s of pretrained-backbone nets at 224 px through the image bake, against a plain loop.

For each backbone kind (``--kinds``; by default a Hugging Face ViT, ConvNeXt and ResNet, random
weights saved with ``save_pretrained`` at small but real widths; ``timm-resnet18``, ``timm-vit`` (ViT-Tiny)
and ``torchvision-resnet18`` through ``nets.TimmNet`` and ``nets.PretrainedNet`` with random weights,
where timm and torchvision import), trainings of ``--steps`` steps on random 224 px images, batch
``--batch``, each in a fresh process so its peak resident memory is its own:

- ``plain``: a plain PyTorch loop (forward, cross-entropy, backward, AdamW step) over the same net:
  the baseline;
- ``full``: ``ImageClassifier`` + Lightning ``Trainer.fit`` (the bake's training path), every weight trained;
- ``lora``: the same, LoRA adapters (r 8) on the attention projections and the head (ViT only: the
  convolutional backbones have no attention);
- ``frozen``: the same, the backbone frozen (``BackboneFreeze`` past the last epoch): the head alone.

Images/s are timed after ``--warmup`` steps; peak RSS is ``ru_maxrss`` of the process. The ratios
within one run (framework / plain loop, LoRA and frozen / full memory) are what to read across machines.

    PYTHONPATH=<image bake>/src python docs/bench_vision_backbones.py digits_classifier [--steps 12]
        [--kinds timm-resnet18 timm-vit torchvision-resnet18]
"""

import argparse
import importlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

KINDS = ("vit", "convnext", "resnet")  # Hugging Face folders
LIBRARY_KINDS = {  # kind: (net class, its arguments), random weights
    "timm-resnet18": ("TimmNet", {"model": "resnet18"}),
    "timm-vit": ("TimmNet", {"model": "vit_tiny_patch16_224"}),
    "torchvision-resnet18": ("PretrainedNet", {"architecture": "resnet18", "weights": None}),
}


def save_backbone(kind: str, folder: Path) -> None:
    import transformers

    configs = {  # a ViT of 6 layers 192 wide (ViT-Tiny's width), ConvNeXt-Atto-like, ResNet-18
        "vit": transformers.ViTConfig(
            image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=6, num_attention_heads=3,
            intermediate_size=768,
        ),
        "convnext": transformers.ConvNextConfig(hidden_sizes=[40, 80, 160, 320], depths=[2, 2, 6, 2]),
        "resnet": transformers.ResNetConfig(hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"),
    }  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModel.from_config(configs[kind]).save_pretrained(folder)


def run_one(package: str, kind: str, folder: str, mode: str, steps: int, warmup: int, batch: int) -> dict:
    """One training in this process; returns images/s and peak RSS (MB)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    nets = importlib.import_module(f"{package}.nets")
    models = importlib.import_module(f"{package}.models")
    callbacks = importlib.import_module(f"{package}.engine.callbacks")
    torch.manual_seed(0)
    images = torch.randn((steps + warmup) * batch, 3, 224, 224)
    labels = torch.randint(0, 10, (len(images),))
    if kind in LIBRARY_KINDS:
        name, arguments = LIBRARY_KINDS[kind]
        net = getattr(nets, name)(num_classes=10, **arguments)
    else:
        lora = nets.LoRA(r=8, target_modules=["q_proj", "v_proj"]) if mode == "lora" else None
        net = nets.HFImageClassifier(folder, num_classes=10, lora=lora)
    times: list[float] = []
    if mode == "plain":
        optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-3)
        net.train()
        for step in range(steps + warmup):
            x, y = images[step * batch : (step + 1) * batch], labels[step * batch : (step + 1) * batch]
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - start)
    else:

        class Timer(L.Callback):
            def on_train_batch_start(self, *args) -> None:
                self.start = time.perf_counter()

            def on_train_batch_end(self, *args) -> None:
                times.append(time.perf_counter() - self.start)

        extra = [callbacks.BackboneFreeze(unfreeze_at_epoch=10)] if mode == "frozen" else []
        model = models.ImageClassifier(net, num_classes=10, lr_scheduler=None)
        trainer = L.Trainer(
            accelerator="cpu", max_steps=steps + warmup, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[Timer(), *extra],
        )  # fmt: skip
        loader = DataLoader(TensorDataset(images, labels), batch_size=batch, shuffle=False)
        trainer.fit(model, train_dataloaders=loader)
    rate = batch * steps / sum(times[warmup:])
    return {"images_per_s": rate, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=[*KINDS, *LIBRARY_KINDS])
    parser.add_argument("--one", nargs=3, metavar=("KIND", "FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, folder, mode = args.one
        print(json.dumps(run_one(args.package, kind, folder, mode, args.steps, args.warmup, args.batch)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}, 224 px, "
              f"{args.steps} timed steps after {args.warmup}")  # fmt: skip
        for kind in args.kinds:
            folder = Path(scratch) / kind
            if kind in KINDS:
                save_backbone(kind, folder)
            results = {}
            for mode in ("plain", "full", "lora", "frozen") if kind == "vit" else ("plain", "full", "frozen"):
                command = [sys.executable, __file__, args.package, "--one", kind, str(folder), mode]
                command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            plain, full = results["plain"], results["full"]
            for mode, result in results.items():
                speed = result["images_per_s"] / plain["images_per_s"]
                memory = result["peak_rss_mb"] / full["peak_rss_mb"]
                print(f"{kind:8s} {mode:6s} {result['images_per_s']:7.1f} images/s ({speed:.2f}x plain), "
                      f"peak RSS {result['peak_rss_mb']:6.0f} MB ({memory:.2f}x full)")  # fmt: skip


if __name__ == "__main__":
    main()
