# The gateways users choose between, pinned, for scripts/bench-peers and
# `scripts/bench-streams --peers`. `install_peers` installs (when missing) Node and Portkey's
# gateway (npm) and LiteLLM's proxy with its server extras (PyPI, in a venv) into
# ~/.cache/probeok-bench, and sets `portkey_js` (the gateway's start script, run with node)
# and `litellm_bin`. Once installed, nothing reaches the network.
#
# Portkey's gateway accepts any @hono/node-server 1.x; from 1.14.2 on, that server's Response
# keeps the upstream response's immutable headers, and the gateway's adding its own to them
# fails every streamed chat completion ("TypeError: immutable", answered 500; reported on
# Portkey's tracker as "TypeError: immutable with incompatible version of @hono/node-server").
# npm's `overrides` holds it at the last release before that.

PORTKEY_VERSION=1.15.2
HONO_NODE_SERVER_VERSION=1.14.1
LITELLM_VERSION=1.108.7
peers_cache="${XDG_CACHE_HOME:-$HOME/.cache}/probeok-bench"
portkey_js=
litellm_bin=

install_peers() {
  command -v node >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
  }
  local pk="$peers_cache/peers/portkey-$PORTKEY_VERSION"
  portkey_js="$pk/node_modules/@portkey-ai/gateway/build/start-server.js"
  if ! grep -q "\"version\": \"$PORTKEY_VERSION\"" "$pk/node_modules/@portkey-ai/gateway/package.json" 2>/dev/null ||
    ! grep -q "\"version\": \"$HONO_NODE_SERVER_VERSION\"" "$pk/node_modules/@hono/node-server/package.json" 2>/dev/null; then
    echo "installing Portkey's gateway $PORTKEY_VERSION into $pk (once)" >&2
    mkdir -p "$pk"
    cat >"$pk/package.json" <<JSON
{
  "private": true,
  "dependencies": { "@portkey-ai/gateway": "$PORTKEY_VERSION" },
  "overrides": { "@hono/node-server": "$HONO_NODE_SERVER_VERSION" }
}
JSON
    (cd "$pk" && npm install --silent --no-audit --no-fund)
  fi
  local venv="$peers_cache/peers/venv"
  if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('litellm') == '$LITELLM_VERSION'" 2>/dev/null; then
    echo "installing LiteLLM's proxy $LITELLM_VERSION into $venv (once)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "litellm[proxy]==$LITELLM_VERSION"
  fi
  litellm_bin="$venv/bin/litellm"
}
