#!/usr/bin/env bash
# The network tier, its own command (not in scripts/test.sh: it needs root for network namespaces): set-up,
# then tests/net: hosts of their own in namespaces, links capped (tc tbf), cut silently or refused (iptables),
# one way or both, taken down. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
missing=()
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[test_net] installing ${missing[*]} (Debian packages)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
exec .venv/bin/python -m pytest tests/net -m net -p no:cacheprovider -v "$@"
