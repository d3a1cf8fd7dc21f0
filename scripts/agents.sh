#!/usr/bin/env bash
# Installs the agent CLIs the tests run unchanged (Codex CLI, Claude Code) into ./.agents, exactly as
# requirements/agents/package-lock.json pins them (each tarball's sha512: npm ci refuses any other file),
# with install scripts off; Claude Code's one step (placing its native binary from the pinned platform
# package) is then run by name.
# Idempotent: a second run with the lock unchanged takes no time. Prints the folder of their commands.
# Where npm is missing it says so and installs nothing (the CLI tests skip, naming the reason).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEST=${LIVELOOP_AGENTS_DIR:-$ROOT/.agents}
LOCK=$ROOT/requirements/agents
if ! command -v npm >/dev/null; then
  echo "[agents] npm is not installed: the Codex CLI and Claude Code tests will skip" >&2
  exit 0
fi
want=$(cat "$LOCK/package.json" "$LOCK/package-lock.json" "$ROOT/scripts/agents.sh" | sha256sum | cut -d' ' -f1)
if [ -x "$DEST/node_modules/.bin/codex" ] && [ -x "$DEST/node_modules/.bin/claude" ] \
   && [ "$(cat "$DEST/.liveloop-stamp" 2>/dev/null)" = "$want" ]; then
  echo "$DEST/node_modules/.bin"
  exit 0
fi
echo "[agents] $DEST from requirements/agents/package-lock.json" >&2
rm -rf "$DEST"
mkdir -p "$DEST"
cp "$LOCK/package.json" "$LOCK/package-lock.json" "$DEST/"
(cd "$DEST" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2 \
  && node node_modules/@anthropic-ai/claude-code/install.cjs >&2)
"$DEST/node_modules/.bin/codex" --version >&2
"$DEST/node_modules/.bin/claude" --version >&2
echo "$want" > "$DEST/.liveloop-stamp"
echo "$DEST/node_modules/.bin"
