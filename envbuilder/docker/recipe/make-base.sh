#!/usr/bin/env bash
# Makes a minimal local Python base image without any container registry:
# debootstrap a Debian (variant minbase) with python3 + venv from the Debian mirror this
# machine's apt is configured with, then `docker import` it. Used by the Docker tests and
# the build benchmark, where no base image can be pulled. Run as root.
#   usage: envbuilder/docker/recipe/make-base.sh TAG [SUITE [PACKAGE...]]     (bookworm's python3 is 3.11)
# PACKAGEs are Debian packages added to the image (the workflow rehearsal's runner
# image adds git, curl and ca-certificates: what a hosted runner has before any step).
# Does nothing when TAG already exists (delete the image to re-create it).
set -euo pipefail
tag=${1:?usage: make-base.sh TAG [SUITE [PACKAGE...]]}
suite=${2:-bookworm}
include=python3,python3-venv
for package in "${@:3}"; do include+=",$package"; done
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "make-base.sh: $tag exists"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "make-base.sh: debootstrap is missing (sudo bash .ci/setup)" >&2; exit 3; }
# The first non-security mirror that apt is configured with (deb822 or one-line sources).
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
  | awk '/^URIs:/ {print $2} /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
  | grep -v -- '-security' | head -n1 || true)
[ -n "$mirror" ] || { echo "make-base.sh: no Debian mirror found in /etc/apt/sources.list*" >&2; exit 3; }
root=$(mktemp -d "${TMPDIR:-/tmp}/envbuilder-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "+ debootstrap --variant=minbase --include=$include $suite $root $mirror"
debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" --numeric-owner -c . | docker import \
  -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["python3"]' - "$tag"
echo "make-base.sh: built $tag"
