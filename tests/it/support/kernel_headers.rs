//! Kernel header trees as Debian splits them, for tests of the code that
//! finds and checks headers.

use std::fs;
use std::path::{Path, PathBuf};

/// Debian's split layout under `base`: the arch dir
/// `usr/src/linux-headers-<dir_release>` (release `uts` in its
/// `utsrelease.h`) whose Makefile includes the common dir
/// `usr/src/linux-headers-common` by absolute path. Returns the arch dir.
pub fn debian_split(base: &Path, dir_release: &str, uts: &str) -> PathBuf {
    let arch = base.join(format!("usr/src/linux-headers-{dir_release}"));
    let common = base.join("usr/src/linux-headers-common");
    fs::create_dir_all(arch.join("include/generated")).unwrap();
    fs::create_dir_all(common.join("include/linux")).unwrap();
    fs::write(
        arch.join("Makefile"),
        "include /usr/src/linux-headers-common/Makefile\n",
    )
    .unwrap();
    fs::write(common.join("Makefile"), "# common\n").unwrap();
    fs::write(
        arch.join("include/generated/utsrelease.h"),
        format!("#define UTS_RELEASE \"{uts}\"\n"),
    )
    .unwrap();
    arch
}
