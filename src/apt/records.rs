//! What a Release file and a `Packages` index say, as far as the installer
//! reads them.

use std::cmp::Ordering;

use super::version::compare_versions;

/// One line of a Release file's `SHA256:` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseFile {
    /// Relative to `dists/<suite>/`, e.g. `main/binary-amd64/Packages.xz`.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// The parts of a Release file the installer uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Release {
    pub suite: Option<String>,
    pub codename: Option<String>,
    pub components: Vec<String>,
    pub architectures: Vec<String>,
    pub sha256: Vec<ReleaseFile>,
}

impl Release {
    pub fn file(&self, path: &str) -> Option<&ReleaseFile> {
        self.sha256.iter().find(|f| f.path == path)
    }
}

/// One stanza of a `Packages` index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// Relative to the repository root, e.g. `pool/main/l/linux/…deb`.
    pub filename: String,
    pub size: Option<u64>,
    /// Lower-case hex; `None` if the index gives none (then the package
    /// cannot be downloaded verified).
    pub sha256: Option<String>,
    /// Each inner list is one group of alternatives (`a | b`).
    pub depends: Vec<Vec<Dependency>>,
    /// Virtual package names (version constraints dropped).
    pub provides: Vec<String>,
}

/// A relation in a `Depends:` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `<<`
    Less,
    /// `<=`
    LessEq,
    /// `=`
    Eq,
    /// `>=`
    GreaterEq,
    /// `>>`
    Greater,
}

/// `name[:arch] [(op version)]`; architecture restrictions (`[amd64]`) and
/// build profiles (`<…>`) are dropped: they do not occur in binary indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    pub name: String,
    pub constraint: Option<(Relation, String)>,
}

impl Dependency {
    /// Whether `version` meets the constraint (true without one).
    pub fn allows(&self, version: &str) -> bool {
        let Some((rel, want)) = &self.constraint else {
            return true;
        };
        let ord = compare_versions(version, want);
        match rel {
            Relation::Less => ord == Ordering::Less,
            Relation::LessEq => ord != Ordering::Greater,
            Relation::Eq => ord == Ordering::Equal,
            Relation::GreaterEq => ord != Ordering::Less,
            Relation::Greater => ord == Ordering::Greater,
        }
    }
}

impl std::fmt::Display for Dependency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if let Some((rel, v)) = &self.constraint {
            let op = match rel {
                Relation::Less => "<<",
                Relation::LessEq => "<=",
                Relation::Eq => "=",
                Relation::GreaterEq => ">=",
                Relation::Greater => ">>",
            };
            write!(f, " ({op} {v})")?;
        }
        Ok(())
    }
}
