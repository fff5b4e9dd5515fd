"""Time of a scored answer's ``text_offset`` (``/v1/completions`` with ``echo`` and ``logprobs``): each prefix decoded
whole (before 2026-11-28) against the windowed decode of ``ChoiceText.offset``, both in this run.

    python docs/bench_text_offset.py <language-model bake>   (its src/ on PYTHONPATH)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]) / "src"))
package = next(path.name for path in (Path(sys.argv[1]) / "src").iterdir() if (path / "serving").is_dir())
tokenizers = __import__(f"{package}.data.tokenizer", fromlist=["ByteTokenizer", "BPETokenizer"])
completions = __import__(f"{package}.serving.completions", fromlist=["ChoiceText", "CUT"])
text_module = __import__(f"{package}.data.text", fromlist=["bundled_text"])

corpus = text_module.bundled_text().decode("utf-8")
bpe = tokenizers.BPETokenizer.train([corpus[:300_000]], vocab_size=2048)
for name, tokenizer in (("bytes", tokenizers.ByteTokenizer()), ("BPE (vocabulary 2,048)", bpe)):
    for length in (512, 2048):
        ids = tokenizer.encode(corpus[100_000:120_000])[:length]
        scores = [[token, None, []] for token in ids]
        started = time.perf_counter()
        windowed = completions.ChoiceText(0, tokenizer, [], False, 1).scores(scores)["text_offset"]
        new = time.perf_counter() - started
        started = time.perf_counter()
        whole = [len(tokenizer.decode(ids[:i]).rstrip(completions.CUT)) for i in range(len(ids))]
        old = time.perf_counter() - started
        assert windowed == whole
        figures = f"each prefix whole {old * 1e3:.1f} ms, windowed {new * 1e3:.1f} ms ({old / new:.1f}x)"
        print(f"{name}, {length} tokens: {figures}")
