"""Print the shell commands of a bake's own CI workflow (.github/workflows/ci.yml), one JSON string a line.

.ci/slow runs them in order in the bake, so the template's CI runs the user's CI as written, not a
copy of it. Steps with an `if:` (the weekly slow tests) are left out and named on stderr: .ci/slow
runs those tests itself. A `TORCH=...` argument (the workflow's CPU wheel index, out of reach here)
is replaced by the torch of this environment, given as the second argument.

Usage: python .ci/workflow_steps.py <bake>/.github/workflows/ci.yml "<torch spec>"
"""

import json
import re
import sys
from pathlib import Path

import yaml

workflow, torch = sys.argv[1], sys.argv[2]
steps = [step for job in yaml.safe_load(Path(workflow).read_text())["jobs"].values() for step in job["steps"]]
runs = [step for step in steps if "run" in step]
if not runs:
    sys.exit(f"{workflow}: no step runs a command")
for step in runs:
    if "if" in step:
        name = step.get("name", step["run"])
        print(f"workflow: left to .ci/slow's own run: {name} (if: {step['if']})", file=sys.stderr)
        continue
    command = re.sub(r'TORCH="[^"]*"', f"TORCH={json.dumps(torch)}", step["run"].strip())
    print(json.dumps(command))
