//! A local apt repository of downloaded .debs (pool/ + dists/<suite>/),
//! indexed by dpkg-scanpackages, with a Release that lists the index
//! files' sizes and sha256 as Debian's archive does.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use sha2::{Digest as _, Sha256};

use crate::cmd::cmd;
use crate::deadline;

const LIMIT: Duration = Duration::from_secs(600);
const INDEXES: [&str; 3] = [
    "main/binary-amd64/Packages",
    "main/binary-amd64/Packages.gz",
    "main/binary-amd64/Packages.xz",
];

/// Indexes `repo`'s pool into `dists/<suite>/` and writes its Release and
/// InRelease; `scratch` holds gpg's throwaway home.
pub fn index(repo: &Path, suite: &str, scratch: &Path, log: impl Fn(&str)) -> Result<()> {
    let dists = repo.join("dists").join(suite);
    let packages = dists.join(INDEXES[0]);
    let mut scan = cmd("dpkg-scanpackages");
    scan.args(["--multiversion", "pool", "/dev/null"])
        .current_dir(repo)
        .stderr(Stdio::null());
    let index = deadline::read(&mut scan, LIMIT)?;
    std::fs::write(&packages, index).with_context(|| format!("writing {}", packages.display()))?;
    deadline::run(cmd("xz").args(["-k", "-9"]).arg(&packages), LIMIT)?;
    deadline::run(cmd("gzip").args(["-k", "-9", "-n"]).arg(&packages), LIMIT)?;
    let mut entries = Vec::new();
    for name in INDEXES {
        let p = dists.join(name);
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        entries.push((
            hex::encode(Sha256::digest(&bytes)),
            bytes.len() as u64,
            name,
        ));
    }
    let release = release(suite, &rfc2822(SystemTime::now()), &entries);
    std::fs::write(dists.join("Release"), &release)?;
    let inrelease = dists.join("InRelease");
    if crate::cmd::on_path("gpg") {
        if sign(&dists.join("Release"), &inrelease, &scratch.join("gnupg")).is_ok() {
            return Ok(());
        }
        log("gpg could not sign; writing an unsigned clearsign-shaped InRelease");
    }
    std::fs::write(&inrelease, unsigned_inrelease(&release))
        .with_context(|| format!("writing {}", inrelease.display()))
}

/// InRelease signed with a throwaway key. tests/it/headers.rs does not
/// trust it: it serves the Release re-signed with the committed test-only
/// key (tests/fixtures/apt/), so a cached repository from before keeps
/// working.
fn sign(release: &Path, inrelease: &Path, home: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().mode(0o700).create(home)?;
    let gpg = |args: &[&str]| {
        let mut c: Command = cmd("gpg");
        c.env("GNUPGHOME", home)
            .args(["--batch", "--quiet"])
            .args(args)
            .stderr(Stdio::null());
        c
    };
    deadline::run(
        &mut gpg(&[
            "--passphrase",
            "",
            "--quick-gen-key",
            "gpu-driver test data <test-data@invalid>",
            "ed25519",
            "sign",
            "never",
        ]),
        LIMIT,
    )?;
    let mut c = gpg(&["--yes", "--clearsign", "--output"]);
    c.arg(inrelease).arg(release);
    deadline::run(&mut c, LIMIT)
}

/// The Release of the repository: `entries` are (sha256, size, path).
fn release(suite: &str, date: &str, entries: &[(String, u64, &str)]) -> String {
    let mut s = format!(
        "Origin: gpu-driver test data\nLabel: Debian {suite} kernel headers (subset)\n\
         Suite: {suite}\nCodename: {suite}\nDate: {date}\nArchitectures: amd64\n\
         Components: main\nSHA256:\n"
    );
    for (sha, size, name) in entries {
        let _ = writeln!(s, " {sha} {size:>16} {name}");
    }
    s
}

/// Without gpg: the same shape as a clearsigned InRelease, with a
/// placeholder signature block.
fn unsigned_inrelease(release: &str) -> String {
    let mut s = String::from("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n");
    for l in release.lines() {
        // Dash-escaping, as a clearsigned text has it.
        if l.starts_with('-') {
            s.push_str("- ");
        }
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(
        "-----BEGIN PGP SIGNATURE-----\n\nbm90IGEgc2lnbmF0dXJl\n-----END PGP SIGNATURE-----\n",
    );
    s
}

/// (year, month, day, seconds of the day, weekday with 0 = Monday) of `t`
/// in UTC.
fn civil(t: SystemTime) -> (i64, u32, u32, u64, u64) {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86400) as i64;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    // 1970-01-01 was a Thursday.
    (y, m, d, secs % 86400, (days as u64 + 3) % 7)
}

/// `date -u -R` in the C locale: `Mon, 07 Dec 2026 20:19:05 +0000`.
fn rfc2822(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, m, d, s, wd) = civil(t);
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} +0000",
        DAYS[wd as usize],
        MONTHS[m as usize - 1],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// `date -u +%FT%TZ`: `2026-12-07T20:19:05Z`.
pub fn iso8601(t: SystemTime) -> String {
    let (y, m, d, s, _) = civil(t);
    format!(
        "{y}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_674_745);
        assert_eq!(rfc2822(t), "Mon, 07 Dec 2026 20:19:05 +0000");
        assert_eq!(iso8601(t), "2026-12-07T20:19:05Z");
        assert_eq!(rfc2822(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 +0000");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(iso8601(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn release_and_unsigned_inrelease() {
        let r = release(
            "bookworm",
            "Mon, 07 Dec 2026 20:19:05 +0000",
            &[("ab".repeat(32), 1234, "main/binary-amd64/Packages")],
        );
        assert_eq!(
            r,
            format!(
                "Origin: gpu-driver test data\nLabel: Debian bookworm kernel headers (subset)\n\
                 Suite: bookworm\nCodename: bookworm\nDate: Mon, 07 Dec 2026 20:19:05 +0000\n\
                 Architectures: amd64\nComponents: main\nSHA256:\n {}             1234 \
                 main/binary-amd64/Packages\n",
                "ab".repeat(32)
            )
        );
        let i = unsigned_inrelease("Suite: x\n-dash\n");
        assert_eq!(
            i,
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nSuite: x\n- -dash\n\
             -----BEGIN PGP SIGNATURE-----\n\nbm90IGEgc2lnbmF0dXJl\n-----END PGP SIGNATURE-----\n"
        );
    }
}
