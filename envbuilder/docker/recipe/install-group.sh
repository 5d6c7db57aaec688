#!/bin/sh
# Makes the trees of an envbuilder image's layers, in a container of the base image
# (envbuilder/docker/build.py runs it with network "none"):
#   install-group.sh OUT GROUP...
# GROUP "venv": the empty venv /opt/venv and the non-root user envbuilder (uid 10001),
#   as OUT/venv/{opt/venv,etc/passwd,etc/group,home/envbuilder}.
# Any other GROUP: the wheels in /envbuilder/wheels/GROUP (mounted read-only from the
#   host's wheel cache, with requirements.txt: name==version --hash=sha256:...), installed
#   by pip into OUT/GROUP/opt/venv. Every wheel is checked against its hash, nothing is
#   resolved (--no-deps) or fetched (--no-index). OUT/GROUP/opt/venv/.envbuilder/GROUP.txt
#   records the group's requirements (it also keeps an empty group's layer distinct from
#   its neighbours'). Then its bytecode goes into OUT/GROUP-bytecode, a layer of its own
#   right above the group's (envbuilder/docker/recipe/bytecode.py: unchecked-hash .pyc
#   files, the same bytes from the same wheels; test directories stay source only), with
#   OUT/GROUP-bytecode/opt/venv/.envbuilder/GROUP-bytecode.txt saying so.
# A group's tree is final as soon as pip is done, and its bytecode is compiled in the
# background while the next group installs; when a tree is final (and handed to
# $ENVBUILDER_OWNER, uid:gid, where set), the line "install-group.sh: NAME done" says so:
# envbuilder hashes it, and may send it to the daemon, while the rest installs.
# envbuilder writes each OUT/NAME as one layer (envbuilder/docker/layers.py).
set -eu
out=$1
shift
installer=""
now() { date +%s%N 2>/dev/null | cut -c1-13; }  # milliseconds
seconds() { echo "$(( ($(now) - $1) / 1000 )).$(( ($(now) - $1) % 1000 / 100 ))"; }
finish() {  # GROUP: the tree is final
  if [ -n "${ENVBUILDER_OWNER:-}" ]; then chown -R "$ENVBUILDER_OWNER" "$out/$1"; fi
  echo "install-group.sh: $1 done"
}
for group in "$@"; do
  stage="$out/$group"
  mkdir -p "$stage"
  if [ "$group" = venv ]; then
    python3 -m venv --without-pip /opt/venv
    mkdir -p "$stage/opt" "$stage/etc" "$stage/home/envbuilder"
    cp -a /opt/venv "$stage/opt/venv"
    rm -rf /opt/venv
    cp -p /etc/passwd /etc/group "$stage/etc/"
    if ! grep -q '^envbuilder:' /etc/passwd; then
      echo 'envbuilder:x:10001:10001:envbuilder:/home/envbuilder:/bin/sh' >> "$stage/etc/passwd"
      echo 'envbuilder:x:10001:' >> "$stage/etc/group"
    fi
    finish "$group"
    continue
  fi
  if [ -z "$installer" ]; then
    # pip for this container only: the image's venv has none. pip runs from the wheel
    # that `python3 -m venv` would install (ensurepip's, or Debian's python-wheels),
    # unpacked: a venv with pip installs and byte-compiles pip and setuptools (4 s).
    python3 -m venv --without-pip /opt/venv
    installer=/opt/venv/bin/python
    wheel=$(python3 -c 'import ensurepip, glob, os
here = os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")
found = sorted(glob.glob(os.path.join(here, "pip-*.whl")) + glob.glob("/usr/share/python-wheels/pip-*.whl"))
print(found[-1] if found else "")' 2>/dev/null || true)
    if [ -n "$wheel" ] && python3 -m zipfile -e "$wheel" /opt/envbuilder-pip; then
      export PYTHONPATH=/opt/envbuilder-pip
      echo "install-group.sh: pip from $wheel"
    else
      rm -rf /opt/venv /opt/envbuilder-pip
      python3 -m venv /opt/venv
      echo "install-group.sh: pip from a venv (no pip wheel found beside ensurepip)"
    fi
  fi
  wheels=/envbuilder/wheels/$group
  mkdir -p "$stage/opt/venv/.envbuilder"
  cp "$wheels/requirements.txt" "$stage/opt/venv/.envbuilder/$group.txt"
  bytecode="$out/$group-bytecode"
  mkdir -p "$bytecode/opt/venv/.envbuilder"
  echo "unchecked-hash .pyc files of the $group layer" > "$bytecode/opt/venv/.envbuilder/$group-bytecode.txt"
  if grep -q '[^[:space:]]' "$wheels/requirements.txt"; then
    echo "install-group.sh: installing $group"
    started=$(now)
    PIP_CONFIG_FILE=/dev/null "$installer" -m pip install \
      --root "$stage" --ignore-installed --no-deps --require-hashes --no-index \
      --find-links "$wheels" --no-compile --no-cache-dir --disable-pip-version-check \
      --no-warn-script-location --root-user-action=ignore --progress-bar off \
      -r "$wheels/requirements.txt"
    echo "install-group.sh: byte-compiling $group (installed in $(seconds "$started") s)"
    finish "$group"
    (
      started=$(now)
      PYTHONHASHSEED=0 "$installer" /envbuilder/recipe/bytecode.py "$stage" "$bytecode" \
        || { echo "install-group.sh: $group did not byte-compile; it stays source only"
             find "$bytecode" -name __pycache__ -prune -exec rm -rf {} +; }
      echo "install-group.sh: $group byte-compiled in $(seconds "$started") s"
      finish "$group-bytecode"
    ) &
  else
    echo "install-group.sh: no wheels in $group"
    finish "$group"
    finish "$group-bytecode"
  fi
done
wait
