#!/usr/bin/env bash
# Regenerate the Python modules for our .proto files with grpcio-tools.
#
#   hack/gen-protos.sh            write next to the .proto files (commit the result)
#   hack/gen-protos.sh OUT_DIR    write under OUT_DIR/protos/... instead (the drift test uses this)
#
# protoc runs from the repository root with "-I ." so every file registers in the
# protobuf descriptor pool under its repository path (protos/dra/v1/api.proto, ...).
# Several files are named api.proto; their distinct paths are what lets all of them
# load into one Python process, and the generated imports become package-absolute
# (from protos.dra.v1 import api_pb2).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi

cd "$repo"
# Sorted so the generated output does not depend on directory order.
mapfile -t protos < <(find protos -name '*.proto' | LC_ALL=C sort)
if [[ ${#protos[@]} -eq 0 ]]; then
  echo "gen-protos: no .proto files under $repo/protos" >&2
  exit 1
fi

"$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "${protos[@]}"

# Generated modules live in packages; the __init__.py files are committed by hand in
# the tree, and created here only for an out-of-tree run so the result is importable.
if [[ "$out" != "$repo" ]]; then
  for p in "${protos[@]}"; do
    d="$(dirname "$p")"
    while [[ "$d" != "." ]]; do
      touch "$out/$d/__init__.py"
      d="$(dirname "$d")"
    done
  done
fi
