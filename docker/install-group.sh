#!/bin/sh
# Installs one layer group of a lock inside an envbuilder build stage:
#   install-group.sh GROUP WHEELS_DIR STAGE_DIR
# WHEELS_DIR holds the group's wheels and requirements.txt (name==version --hash=sha256:...).
# Every wheel is checked against its hash, nothing is resolved (--no-deps), nothing is
# fetched (--no-index), nothing is byte-compiled (--no-compile keeps the tree reproducible).
# Files land under STAGE_DIR/opt/venv, to be copied into the final image's /opt/venv, with
# the group's requirements as /opt/venv/.envbuilder/GROUP.txt: a record of what the layer holds
# (it also keeps an empty group's layer distinct from its neighbours').
set -eu
group=$1
wheels=$2
stage=$3
mkdir -p "$stage/opt/venv/.envbuilder"
cp "$wheels/requirements.txt" "$stage/opt/venv/.envbuilder/$group.txt"
if grep -q '[^[:space:]]' "$wheels/requirements.txt"; then
  PIP_CONFIG_FILE=/dev/null /opt/venv/bin/python -m pip install \
    --root "$stage" --ignore-installed --no-deps --require-hashes --no-index \
    --find-links "$wheels" --no-compile --no-cache-dir --disable-pip-version-check \
    --no-warn-script-location --root-user-action=ignore --progress-bar off \
    -r "$wheels/requirements.txt"
else
  echo "install-group.sh: no wheels in this group"
fi
# Same files, same layer: with every timestamp fixed, the layer copied from this stage is
# byte-identical wherever and whenever the same wheels are installed (no build cache needed).
find "$stage" -exec touch -h -d @0 {} +
