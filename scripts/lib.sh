# Shared helpers for scripts/*: stage timing and the static build's path.
# shellcheck shell=bash

STATIC_TARGET=x86_64-unknown-linux-gnu
STATIC_BIN="target/${STATIC_TARGET}/release/gpu-driver-installer"

_stage_name=""
_stage_start=0

stage() {
  stage_end
  _stage_name="$1"
  _stage_start=$(date +%s)
  echo "==> ${_stage_name}" >&2
}

stage_end() {
  if [ -n "${_stage_name}" ]; then
    echo "<== ${_stage_name}: $(( $(date +%s) - _stage_start ))s" >&2
    _stage_name=""
  fi
}
