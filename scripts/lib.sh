# Shared helpers for scripts/*: the cache root, stage timing, free ports,
# keyed cache pruning and the Debian packages each script needs.
# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are for the scripts that source this

STATIC_TARGET=x86_64-unknown-linux-gnu
STATIC_BIN="target/${STATIC_TARGET}/release/gpu-driver-installer"

# cache_root: the tooling's one cache, resolved as `cargo xtask cache-root`
# resolves it.
cache_root() {
  echo "${GPU_DRIVER_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/gpu-driver}"
}

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
    echo "<== ${_stage_name}: $(( $(date +%s) - _stage_start ))s ($(free_mib .) MiB free)" >&2
    _stage_name=""
  fi
}

# free_mib DIR: the space left on DIR's filesystem, in MiB (a run that
# fills the disk says at which stage).
free_mib() {
  df -Pm "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'
}

# free_port [COUNT]: the first of COUNT consecutive loopback ports nobody
# listens on now (others may run servers and clusters here too).
free_port() {
  local n=${1:-1} base p _
  for _ in $(seq 200); do
    base=$(( 20000 + RANDOM % 32000 ))
    for ((p = base; p < base + n; p++)); do
      (exec 3<>"/dev/tcp/127.0.0.1/${p}") 2>/dev/null && continue 2
    done
    echo "${base}"
    return 0
  done
  echo "error: no ${n} free loopback port(s) found" >&2
  return 1
}

# prune_other_keys DIR KEEP: a keyed cache (DIR/<key>) never uses an entry
# again once its inputs changed. Marks KEEP used and deletes DIR's other
# entries (and leftover *.tmp) unused for GPU_DRIVER_CACHE_GRACE_MIN
# minutes (default 60: a second checkout beside this one keeps its entry).
# Call it under the cache's lock.
prune_other_keys() {
  local dir=$1 keep=$2 grace=${GPU_DRIVER_CACHE_GRACE_MIN:-60} e
  case "${grace}" in '' | *[!0-9]*) grace=60 ;; esac
  [ ! -d "${keep}" ] || touch "${keep}"
  for e in "${dir}"/* "${dir}"/.*.tmp; do
    [ -d "${e}" ] && [ ! -L "${e}" ] && [ "${e}" != "${keep}" ] || continue
    [ -n "$(find "${e}" -maxdepth 0 -mmin "+${grace}")" ] || continue
    rm -rf --one-file-system "${e}"
    echo "deleted ${e} (not this run's key, unused for ${grace}+ min)" >&2
  done
}

# ensure_tools CMD:PACKAGE ...: installs the Debian packages whose commands
# (or, for a CMD starting with /, files) are missing.
ensure_tools() {
  local need=() pair
  for pair in "$@"; do
    case "${pair%%:*}" in
      /*) [ -e "${pair%%:*}" ] || need+=("${pair##*:}") ;;
      *) command -v "${pair%%:*}" >/dev/null || need+=("${pair##*:}") ;;
    esac
  done
  [ ${#need[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing packages ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    return 1
  fi
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# The test tools (as the xtask's apt lists): .run files, Debian packages,
# test modules, certificates and health polls.
TEST_TOOLS=(file:file chroot:coreutils makeself:makeself xz:xz-utils bzip2:bzip2
  zstd:zstd cksum:coreutils dpkg-deb:dpkg dpkg-scanpackages:dpkg-dev gzip:gzip
  gcc:gcc cc:gcc make:make /usr/include/stdio.h:libc6-dev
  /usr/lib/x86_64-linux-gnu/libelf.so.1:libelf1 /usr/lib/x86_64-linux-gnu/libcrypto.so.3:libssl3
  openssl:openssl curl:curl flock:util-linux jq:jq)

# Builder roots and the work in them (matrix, benchmarks, e2e).
ROOT_TOOLS=(debootstrap:debootstrap flock:util-linux mountpoint:util-linux
  jq:jq timeout:coreutils)

# The x86_64 VM tests: QEMU, busybox-static and cpio for the initramfs,
# gcc/make for the test module, binutils' strip.
VM_TOOLS=(qemu-system-x86_64:qemu-system-x86 busybox:busybox-static cpio:cpio
  gcc:gcc make:make strip:binutils)

# scripts/build-images: buildah without a daemon, debootstrap for the base,
# static glibc for the pause binary, jq and tar to read the OCI archives.
IMAGE_TOOLS=(buildah:buildah debootstrap:debootstrap flock:util-linux unshare:util-linux file:file
  gcc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev jq:jq tar:tar)

# The arm64 VM test: QEMU's arm64 machine, cpio for the initramfs.
VM_ARM64_TOOLS=(qemu-system-aarch64:qemu-system-arm cpio:cpio)
