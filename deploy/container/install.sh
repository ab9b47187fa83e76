#!/bin/sh
# The image's install steps, as one script: the Dockerfile runs it, and .ci/deploy-checks runs the same
# script in a clean venv, so CI proves the image's installs work without a container runtime.
#   install.sh deps VENV   a venv at VENV with exactly the locked dependencies (hashes checked)
#   install.sh app VENV    this project into it, adding no dependency the lock did not pin, built with the build
#                          backend of requirements/build.txt (hashes checked): nothing unpinned is downloaded
# Run from the repository's root (the Dockerfile's WORKDIR holds the same files).
set -eu
step=${1:?usage: install.sh deps|app VENV}
venv=${2:?usage: install.sh deps|app VENV}
export PIP_DISABLE_PIP_VERSION_CHECK=1
case "$step" in
  deps)
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --require-hashes -r requirements/run.txt
    ;;
  app)
    # pip would otherwise build in an isolated environment filled with pyproject's [build-system] requirements
    # ("setuptools>=68", "wheel") from whatever index it is given: unpinned, unhashed, and run during the build.
    # The backend goes into a scratch venv of its own, so it never lands in the image's.
    build=$(mktemp -d)
    python3 -m venv "$build/venv"
    "$build/venv/bin/pip" install --quiet --require-hashes -r requirements/build.txt
    "$build/venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --wheel-dir "$build/dist" .
    "$venv/bin/pip" install --quiet --no-deps --no-index "$build"/dist/*.whl
    rm -rf "$build"
    # Every import the code makes must be satisfied by the lock alone (a dependency missing from it
    # fails here, not at a user's first start).
    "$venv/bin/pip" check
    "$venv/bin/python" -c "import bot.app, bot.cli"
    ;;
  *)
    echo "install.sh: unknown step $step (deps or app)" >&2
    exit 2
    ;;
esac
