# Sourced by the batch scripts after `cd` to the project: a job runs in the project's locked
# environment. When PYTHON is the project's .venv and uv.lock exists, the job stops before srun
# (exit 2) if .venv differs from uv.lock, e.g. `make install` was not rerun after `make lock`, or
# pyproject.toml was edited without `make lock`. Offline (compute nodes often have no internet).
# uv must be on the job's PATH, else one line says the check was skipped; LOCK_CHECK=0 skips it.
if [[ "${LOCK_CHECK:-1}" != 0 && "$PYTHON" == .venv/bin/python && -f uv.lock ]]; then
    if ! command -v uv >/dev/null; then
        echo "uv is not on the PATH of this job: .venv is not checked against uv.lock"
    elif ! uv sync --offline --locked --inexact --check --extra dev{{ ' --extra sweep' if cookiecutter.use_sweeps == 'yes' else '' }}{{ ' --extra export --extra serve' if cookiecutter.use_serving == 'yes' else '' }} \
        >/dev/null 2>&1; then
        echo "error: .venv does not match uv.lock; run \`make install\` (after \`make lock\` if you edited" \
            "pyproject.toml) on the login node, then submit again (LOCK_CHECK=0 skips this check)" >&2
        exit 2
    fi
fi
