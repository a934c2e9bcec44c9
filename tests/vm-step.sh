# Sourced by the VM tests' /init scripts (tests/vm-init.sh,
# tests/vm-init-secureboot.sh), which the scripts copy into the initramfs as
# /vm-step.sh beside them: the one marker format, parsed by
# crates/xtask/src/vmlog.rs.
# step NAME ARGS...: runs the installer, prints exit code, result, stderr
# and /proc/modules afterwards.
step() {
  name=$1
  shift
  gpu-driver-installer --log-level info --output /tmp/$name.json "$@" 2>/tmp/$name.err
  rc=$?
  echo "@@BEGIN $name rc=$rc@@"
  cat /tmp/$name.json
  echo "@@END $name@@"
  echo "@@BEGIN $name.stderr@@"
  cat /tmp/$name.err
  echo "@@END $name.stderr@@"
  echo "@@BEGIN $name.modules@@"
  cat /proc/modules
  echo "@@END $name.modules@@"
}
