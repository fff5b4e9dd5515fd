"""Write the torch and Lightning versions and CUDA availability of this Python into the agent guides.

The template's hook runs it when the project is made, and `make install` runs it again with the
project's own environment, so AGENTS.md and .claude/agents/*.md state the stack the project really
runs on (a bake made where torch was not importable says so until then).

Usage: python scripts/agent_guides.py    Exit status 0; leaves the guides alone when torch is not importable.
"""

import re
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
# Each guide's lines that carry the facts, as (pattern, replacement built from the facts).
LINES = {
    "AGENTS.md": [
        (r"^- \*\*PyTorch version:\*\* .*$", "- **PyTorch version:** {versions}"),
        (r"^- \*\*CUDA available:\*\* .*$", "- **CUDA available:** {cuda}"),
    ],
    ".claude/agents/*.md": [(r"^- PyTorch: .*; CUDA available: .*$", "- PyTorch: {versions}; CUDA available: {cuda}")],
}


def facts() -> dict[str, str] | None:
    """``versions`` and ``cuda`` of this interpreter's torch, or None when torch is not importable."""
    try:
        import torch
    except Exception:  # a missing or broken torch: the guides keep what they say
        return None
    try:
        import lightning

        versions = f"{torch.__version__} (Lightning {lightning.__version__})"
    except Exception:
        versions = f"{torch.__version__} (Lightning not installed)"
    if torch.cuda.is_available():
        cuda = f"yes (CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)})"
    elif torch.version.cuda:
        cuda = f"no (a CUDA {torch.version.cuda} build of torch, but no GPU visible)"
    else:
        cuda = "no (CPU build of torch)"
    return {"versions": versions, "cuda": cuda}


def main() -> None:
    found = facts()
    if found is None:
        print("agent_guides: torch is not importable here; the agent guides keep the required range.")
        return
    for pattern, rules in LINES.items():
        for path in sorted(PROJECT.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            for line, replacement in rules:
                text = re.sub(line, lambda _, r=replacement: r.format(**found), text, flags=re.MULTILINE)
            path.write_text(text, encoding="utf-8")
    print(f"agent_guides: PyTorch {found['versions']}, CUDA available: {found['cuda']}", file=sys.stdout)


if __name__ == "__main__":
    main()
