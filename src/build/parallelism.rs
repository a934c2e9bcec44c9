//! How many compilers a build runs at once: one per CPU the process may
//! use, but no more than its container's memory limit holds. An install
//! Job on a 128-CPU GPU node with a memory limit of a few GiB would
//! otherwise start 128 compilers and be killed for memory.

use std::path::Path;

use crate::error::Failure;
use crate::named_file::Named;

/// A cgroup file: small, and only ever read for the limit (a failure
/// leaves the build at one compiler per CPU).
const CGROUP_FILE: Named = Named {
    what: "cgroup file",
    max: 64 << 10,
    reason: Failure::Internal,
    hint: "",
};

/// Anonymous memory one more parallel compile of NVIDIA's kernel sources
/// adds at the build's peak, with margin: `scripts/bench-cache` measured
/// 326 MiB at `-j2` and 850 MiB at `-j8`, about 87 MiB per compiler
/// (docs/operator.md, "Memory").
pub(super) const PER_COMPILER: u64 = 128 << 20;

/// The peak of a build at `-j1` (the installer, make, and the largest
/// single compile): 295 MiB measured, with margin.
pub(super) const BASE: u64 = 320 << 20;

/// `-j` for a build without `--jobs`: the CPUs available (Rust's count
/// follows the cgroup's CPU quota), capped by the memory limit of this
/// process's cgroup when it has one.
pub fn default_jobs() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let limit = memory_limit(Path::new("/"));
    let jobs = cap(cpus, limit);
    if jobs < cpus {
        tracing::info!(
            "compiling with -j{jobs}, not -j{cpus}: the container's memory limit is {} MiB \
             (about {} MiB for the build and {} MiB per compiler)",
            limit.unwrap_or(0) >> 20,
            BASE >> 20,
            PER_COMPILER >> 20
        );
    }
    jobs
}

/// At most `cpus`, at most what `limit` holds after [`BASE`], at least 1.
/// (Each compiler is counted against `limit - BASE`, so one more than the
/// formula would still fit: that is the margin.)
fn cap(cpus: usize, limit: Option<u64>) -> usize {
    let Some(limit) = limit else {
        return cpus.max(1);
    };
    let fits = usize::try_from(limit.saturating_sub(BASE) / PER_COMPILER).unwrap_or(usize::MAX);
    cpus.min(fits).max(1)
}

/// The memory limit of this process's cgroup, read under `root` (`/`
/// outside tests): cgroup v2's `memory.max`, else v1's
/// `memory.limit_in_bytes`. `None` when there is none or it cannot be read;
/// a build then uses every CPU, as before.
fn memory_limit(root: &Path) -> Option<u64> {
    let own = CGROUP_FILE.read_text(&root.join("proc/self/cgroup")).ok()?;
    let (v2, v1) = parse_cgroup_paths(&own);
    let candidates = v2
        .map(|p| ("sys/fs/cgroup", p, "memory.max"))
        .into_iter()
        .chain(v1.map(|p| ("sys/fs/cgroup/memory", p, "memory.limit_in_bytes")));
    for (mount, path, file) in candidates {
        // With a cgroup namespace (containerd on v2) the mount is the
        // container's own cgroup and the path is `/`; without one the path
        // may not exist under the mount, whose root is then the container's.
        for dir in [
            root.join(mount).join(path.trim_start_matches('/')),
            root.join(mount),
        ] {
            let text = CGROUP_FILE.read_text(&dir.join(file));
            if let Ok(text) = text {
                return parse_limit(&text);
            }
        }
    }
    None
}

/// The v2 path (`0::PATH`) and the v1 memory controller's path
/// (`N:…memory…:PATH`) from `/proc/self/cgroup`.
fn parse_cgroup_paths(text: &str) -> (Option<&str>, Option<&str>) {
    let mut v2 = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    (v2, v1)
}

/// A limit file's value: `max` (v2) or v1's "no limit" (a page-rounded
/// `i64::MAX`) are `None`.
fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n < 1 << 60).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_limit_caps_the_compilers() {
        assert_eq!(cap(8, None), 8);
        assert_eq!(cap(128, Some(2 << 30)), 13);
        assert_eq!(cap(2, Some(2 << 30)), 2);
        // A limit smaller than one compiler still builds, with one.
        assert_eq!(cap(16, Some(300 << 20)), 1);
        assert_eq!(cap(0, None), 1);
    }

    /// Captured from a containerd pod on cgroup v2, a v1 host (these
    /// machines) and a hybrid one.
    #[test]
    fn cgroup_paths_are_read_from_proc_self_cgroup() {
        assert_eq!(parse_cgroup_paths("0::/\n"), (Some("/"), None));
        let v1 = "9:name=systemd:/\n4:memory:/process_api/e126e6\n1:cpu:/\n0::/\n";
        assert_eq!(
            parse_cgroup_paths(v1),
            (Some("/"), Some("/process_api/e126e6"))
        );
        let hybrid = "12:cpu,cpuacct:/a\n5:memory:/kubepods/pod1/c1\n";
        assert_eq!(
            parse_cgroup_paths(hybrid),
            (None, Some("/kubepods/pod1/c1"))
        );
        assert_eq!(parse_cgroup_paths("garbage\n"), (None, None));
    }

    #[test]
    fn limits_parse_and_no_limit_is_none() {
        assert_eq!(parse_limit("2147483648\n"), Some(2 << 30));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }

    #[test]
    fn a_pods_limit_is_found_in_its_cgroup_namespace_and_without_one() {
        let root = tempfile::tempdir().unwrap();
        let write = |p: &str, s: &str| {
            let p = root.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        write("proc/self/cgroup", "0::/\n");
        write("sys/fs/cgroup/memory.max", "3221225472\n");
        assert_eq!(memory_limit(root.path()), Some(3 << 30));
        // v1 without a namespace: the path is the host's, the mount the
        // container's own.
        write("proc/self/cgroup", "4:memory:/kubepods/pod1/c1\n");
        write("sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n");
        assert_eq!(memory_limit(root.path()), Some(1 << 30));
        write(
            "sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes",
            "max\n",
        );
        assert_eq!(memory_limit(root.path()), None);
        assert_eq!(memory_limit(&root.path().join("nowhere")), None);
    }
}
