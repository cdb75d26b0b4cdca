#!/usr/bin/env bash
# Regenerates profile_pb2.py (and its type stub profile_pb2.pyi) from pprof's official
# profile.proto. The .proto is not vendored: Debian ships it.
#
# Needs (apt): golang-github-google-pprof-dev (the .proto) and protobuf-compiler (protoc).
#   apt-get install golang-github-google-pprof-dev protobuf-compiler
# PROFILE_PROTO=/path/to/profile.proto overrides where the .proto is read from.
#
# protoc 3.21 (Debian 12) emits the `_builder` style gencode without a runtime version
# check, which the protobuf runtime this project uses (>=4.25, tested with 7.36.2, both the
# upb and the pure-Python backend) still loads. Should a newer runtime ever refuse it,
# regenerate with a matching compiler instead of apt's:
#   pip install grpcio-tools && python -m grpc_tools.protoc ... (same arguments as below)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="${PROFILE_PROTO:-/usr/share/gocode/src/github.com/google/pprof/proto/profile.proto}"
[ -f "$proto" ] || { echo "no $proto: apt-get install golang-github-google-pprof-dev" >&2; exit 1; }
command -v protoc >/dev/null || { echo "no protoc: apt-get install protobuf-compiler" >&2; exit 1; }
# -I the .proto's own folder: the descriptor is registered as "profile.proto", package
# perftools.profiles, as every other pprof consumer registers it.
protoc -I "$(dirname "$proto")" --python_out="$here" --pyi_out="$here" "$(basename "$proto")"
echo "wrote $here/profile_pb2.py and profile_pb2.pyi ($(protoc --version))"
