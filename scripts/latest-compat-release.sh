#!/usr/bin/env bash
# Usage: scripts/latest-compat-release.sh ASSET
#
# Prints the tag of the newest published release (drafts and pre-releases left out) that
# carries the asset ASSET (compat.lock.json, compat-locks.tar.gz), or nothing when no
# release does. Releases without it (the project's own versions, notes) are passed over,
# so an ordinary release never hides the last published lockfile. Exits non-zero when
# GitHub cannot be asked: an older lockfile is never taken for the newest by mistake.
#
# Needs gh with GH_TOKEN and GH_REPO set (the GPU matrix workflow sets both).
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 ASSET" >&2
  exit 2
fi
asset=$1
# gh lists releases newest first and pages through the API itself.
limit=${ENVBUILDER_RELEASE_SEARCH_LIMIT:-1000}

tags=$(gh release list --limit "$limit" --exclude-drafts --exclude-pre-releases \
  --json tagName --jq '.[].tagName')
while IFS= read -r tag; do
  [ -n "$tag" ] || continue
  names=$(gh release view "$tag" --json assets --jq '.assets[].name')
  if grep -qxF -- "$asset" <<<"$names"; then
    printf '%s\n' "$tag"
    exit 0
  fi
done <<<"$tags"
