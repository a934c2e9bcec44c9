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
    echo "<== ${_stage_name}: $(( $(date +%s) - _stage_start ))s ($(free_mib .) MiB free)" >&2
    _stage_name=""
  fi
}

# free_mib DIR — the space left on DIR's filesystem, in MiB (a CI run that
# fills the disk says at which stage).
free_mib() {
  df -Pm "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'
}

# prune_other_keys DIR KEEP — a keyed cache (DIR/<key>, one entry per set of
# inputs) never uses an entry again once its inputs changed, so on a machine
# whose ~/.cache outlives many commits old entries would fill the disk.
# Marks KEEP as used now and deletes DIR's other entries (and leftover
# *.tmp) not used for GPU_DRIVER_CACHE_GRACE_MIN minutes (default 60: a
# second checkout running beside this one keeps its entry). Call it under
# the cache's lock. KEEP may be empty: then only stale entries go.
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

# ensure_tools CMD:PACKAGE ... — installs the Debian packages whose commands
# are missing, so that the README's commands work on a fresh machine.
ensure_tools() {
  local need=() pair
  for pair in "$@"; do
    # A CMD starting with / is a file that must exist (headers, libraries).
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

# What scripts/test needs: `file` checks the static binary; makeself and the
# compressors build the tests' .run files; dpkg-deb unpacks Debian's NVIDIA
# source tarball for the extraction tests.
# dpkg-scanpackages indexes the local apt repository of real kernel headers;
# gcc and make compile a test module against them; gcc (as cc, with
# libc6-dev) also builds the CUDA check helper in build.rs, so every cargo
# build needs it, and the tests' stub libcuda; kbuild's prebuilt tools
# link libelf (objtool) and libcrypto (sign-file). scripts/local-cluster
# makes its certificates with openssl and polls health endpoints with curl;
# scripts/k8s-bins locks its cache with flock.
TEST_TOOLS=(file:file chroot:coreutils makeself:makeself xz:xz-utils bzip2:bzip2
  zstd:zstd cksum:coreutils dpkg-deb:dpkg dpkg-scanpackages:dpkg-dev gzip:gzip
  gcc:gcc cc:gcc make:make /usr/include/stdio.h:libc6-dev
  /usr/lib/x86_64-linux-gnu/libelf.so.1:libelf1 /usr/lib/x86_64-linux-gnu/libcrypto.so.3:libssl3
  openssl:openssl curl:curl flock:util-linux)

# What scripts/builder-root, scripts/matrix and scripts/bench-build need.
ROOT_TOOLS=(debootstrap:debootstrap flock:util-linux mountpoint:util-linux
  python3:python3 timeout:coreutils)

# What scripts/vm-test needs on top: QEMU boots the kernel, busybox-static
# and cpio make the initramfs, gcc/make build the test module, strip (and
# strings) come from binutils.
VM_TOOLS=(qemu-system-x86_64:qemu-system-x86 busybox:busybox-static cpio:cpio
  gcc:gcc make:make strip:binutils)

# What scripts/build-images needs: buildah builds the images without a
# daemon, debootstrap makes their Debian base, gcc with static glibc
# (libc6-dev's libc.a) compiles the pause binary, python3 reads the OCI
# archives back, unshare keeps buildah's writes to /var in its cache.
IMAGE_TOOLS=(buildah:buildah debootstrap:debootstrap flock:util-linux unshare:util-linux file:file
  gcc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev python3:python3 tar:tar)

# What scripts/build-static aarch64 needs: the cross linker and C compiler
# (the -sys crates) and arm64's static glibc.
CROSS_ARM64_TOOLS=(aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu
  /usr/aarch64-linux-gnu/lib/libc.a:libc6-dev-arm64-cross)

# What scripts/vm-test-arm64 needs: QEMU's arm64 machine, cpio for the
# initramfs (the arm64 kernel and busybox come from Debian's archive).
VM_ARM64_TOOLS=(qemu-system-aarch64:qemu-system-arm cpio:cpio)
