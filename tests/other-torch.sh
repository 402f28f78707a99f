#!/usr/bin/env bash
# The same prebuilt abi3 wheel on another torch: tests/wheel-check.sh with an
# older torch 2.x from PyPI, in a venv of its own (cached per version), with
# no compiler. The wheel is not rebuilt for it: one wheel serves every torch.
# Usage: tests/other-torch.sh [torch version, default 2.9.1] [pytest args...]
# Not part of run-all.sh (it downloads a second torch); its result is in the
# README ("Front ends").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH=${1:-2.9.1}
shift || true
DEEPNVME_TORCH_VERSION="$TORCH" exec "$ROOT/tests/wheel-check.sh" "$@"
