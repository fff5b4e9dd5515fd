"""Write the torch and Lightning versions and CUDA availability of this Python into the agent guides.

The template's hook runs it when the project is made, so AGENTS.md and .claude/agents/*.md state
the stack the project runs on. `make install` runs it with ``--keep-known``: it fills only the facts a
bake made where torch was not importable left open, and otherwise leaves the committed guides alone
(one line says when this machine's stack differs), so installing never leaves the git tree dirty.

Usage: python scripts/agent_guides.py [--keep-known]    Exit status 0; leaves the guides alone when
torch is not importable.
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


# What the template's hook writes where it could not import torch: facts still to be filled.
UNKNOWN = ("torch was not importable when the project was made", "**CUDA available:** unknown")


def main(keep_known: bool = False) -> None:
    found = facts()
    if found is None:
        print("agent_guides: torch is not importable here; the agent guides keep the required range.")
        return
    stack = f"PyTorch {found['versions']}, CUDA available: {found['cuda']}"
    for pattern, rules in LINES.items():
        for path in sorted(PROJECT.glob(pattern)):
            old = path.read_text(encoding="utf-8")
            text = old
            for line, replacement in rules:
                text = re.sub(line, lambda _, r=replacement: r.format(**found), text, flags=re.MULTILINE)
            if text == old:
                continue
            if keep_known and not any(unknown in old for unknown in UNKNOWN):
                print(
                    f"agent_guides: {path.relative_to(PROJECT)} names another stack than this machine's ({stack}); "
                    "left as committed (python scripts/agent_guides.py writes this machine's)"
                )
                continue
            path.write_text(text, encoding="utf-8")
    print(f"agent_guides: {stack}", file=sys.stdout)


if __name__ == "__main__":
    main(keep_known="--keep-known" in sys.argv[1:])
