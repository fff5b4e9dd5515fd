"""Take this project to a newer release of the template it was made from (`make update-template`).

cruft (https://cruft.github.io/cruft/) renders the template twice with this project's answers
(.cruft.json): at the commit the project was made from and at the new one, then applies the
difference to this project with `git apply -3`, falling back to `git apply --reject`. It exits 0
and says "updated" even when it left conflict markers or `.rej` files, so this script looks for
them itself and fails, naming each file, until they are resolved.

Usage: python scripts/update_template.py [cruft update options, e.g. --checkout v1.2]
Exit status: 0 when the update applied cleanly (or there was nothing to do), 1 otherwise.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
# Lines git writes around a conflict: `<<<<<<< ours`, `=======`, `>>>>>>> theirs`.
CONFLICT = re.compile(rb"^(<{7}|>{7})( |$)", re.MULTILINE)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=PROJECT, capture_output=True, text=True, check=True).stdout


def fail(message: str) -> None:
    print(f"update-template: {message}", file=sys.stderr)
    sys.exit(1)


def check_ready() -> str:
    """The template's source and commit from .cruft.json; exits with the fix when an update cannot start."""
    cruft_file = PROJECT / ".cruft.json"
    if not cruft_file.is_file():
        fail(
            "this project has no .cruft.json, so it is not linked to its template. Link it once with "
            "`cruft link <template url or path>` (answer with this project's values), commit .cruft.json, then retry."
        )
    if not (PROJECT / ".git").is_dir():
        fail("this project is not a git repository; cruft applies updates through git. Run `git init`, commit, retry.")
    if git("status", "--porcelain"):
        fail("the working tree has uncommitted changes (`git status`); commit or stash them first, then retry.")
    state = json.loads(cruft_file.read_text(encoding="utf-8"))
    return f"{state['template']} @ {state['commit'][:12]}"


def leftovers() -> list[str]:
    """Files the update could not apply cleanly: `.rej` files and files holding conflict markers."""
    changed = git("diff", "HEAD", "--name-only").split() + git("ls-files", "--others", "--exclude-standard").split()
    problems = []
    for name in sorted(set(changed)):
        path = PROJECT / name
        if name.endswith(".rej"):
            problems.append(f"{name} (a hunk that did not apply: merge it by hand, then delete this file)")
        elif path.is_file() and CONFLICT.search(path.read_bytes()):
            problems.append(f"{name} (conflict markers <<<<<<< / >>>>>>>: keep the right lines, remove the markers)")
    return problems


def main() -> None:
    before = check_ready()
    print(f"update-template: from {before}")
    done = subprocess.run([sys.executable, "-m", "cruft", "update", "--skip-apply-ask", *sys.argv[1:]], cwd=PROJECT)
    if done.returncode != 0:
        fail(f"cruft update failed (exit {done.returncode}); see its message above. Nothing was committed.")
    problems = leftovers()
    if problems:
        fail(
            "the update left conflicts to resolve:\n  "
            + "\n  ".join(problems)
            + "\nResolve them, run `make test`, then commit. `git checkout -- . && git clean -fd` undoes the update."
        )
    if not git("status", "--porcelain"):
        print("update-template: nothing to update.")
        return
    print("update-template: applied cleanly. Review with `git diff HEAD`, run `make test`, then commit.")


if __name__ == "__main__":
    main()
