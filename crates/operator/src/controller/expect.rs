//! What this process has written and the caches may not show yet: a
//! reconcile triggered before the watch delivers our own write must not
//! write again. One store of typed expectations (what, for which object,
//! since when), plus the nodes queued for a free install or upgrade slot,
//! all under one lock so that a count and a reservation are one step.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long a created Job counts as running, and a started upgrade as in
/// progress, before the caches must show it themselves.
pub(super) const CACHE_LAG: Duration = Duration::from_secs(60);
/// How long an entry with a lifetime is kept; the caches have long caught
/// up with it by then.
pub(super) const KEPT: Duration = Duration::from_secs(600);

/// What was expected. The object is a Job name for the `Job*` kinds, a
/// node name for the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// This process created the Job.
    JobCreated,
    /// The Job's result is already on its node (or its target).
    JobHandled,
    /// The node's stale ready label / startup taint was taken off, for a
    /// desired-state key.
    Unreadied,
    /// The ready label / taint fix of an installed node was sent, for a key.
    MarksFixed,
    /// The node was told its install waits for a build or was refused,
    /// for a target key (one Event each).
    Gated,
    /// This process started the node's upgrade (cordon patch sent), until
    /// it finished.
    UpgradeStarted,
    /// This process cordoned the node for an upgrade: the ready patch
    /// uncordons it even when the cached node does not show the
    /// `upgrade-cordoned` annotation yet.
    Cordoned,
    /// A verified install for a key: a reconcile on a cached node older
    /// than that patch must not start anything for the key again.
    Installed,
}

impl Kind {
    /// How long `prune` keeps an entry; `None`: until it is forgotten or
    /// replaced (a node-and-key entry is replaced by the next key's).
    fn kept_for(self) -> Option<Duration> {
        match self {
            Kind::JobCreated | Kind::JobHandled | Kind::Cordoned | Kind::Installed => Some(KEPT),
            Kind::Unreadied | Kind::MarksFixed | Kind::Gated | Kind::UpgradeStarted => None,
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// The desired-state or target key the write was for (empty: none).
    key: String,
    at: Instant,
}

/// What [`Expectations::reserve_upgrade`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Reserved,
    /// This process started the node's upgrade; the cache lags.
    Started,
    Full,
}

#[derive(Debug, Default)]
pub(super) struct Expectations {
    entries: HashMap<(Kind, String), Entry>,
    /// Nodes waiting for a free parallel install slot.
    install_queue: HashSet<String>,
    /// Nodes waiting for an upgrade slot.
    upgrade_queue: HashSet<String>,
}

impl Expectations {
    /// Records that `object` is expected to show `kind` (for `key`).
    /// Returns false when the same entry was already there.
    pub(super) fn expect(&mut self, kind: Kind, object: &str, key: &str) -> bool {
        let entry = Entry {
            key: key.to_string(),
            at: Instant::now(),
        };
        self.entries
            .insert((kind, object.to_string()), entry)
            .is_none()
    }

    /// Is `kind` expected of `object` (for any key)?
    pub(super) fn holds(&self, kind: Kind, object: &str) -> bool {
        self.entries.contains_key(&(kind, object.to_string()))
    }

    /// Is `kind` expected of `object` for exactly `key`?
    pub(super) fn holds_for(&self, kind: Kind, object: &str, key: &str) -> bool {
        self.entries
            .get(&(kind, object.to_string()))
            .is_some_and(|e| e.key == key)
    }

    pub(super) fn forget(&mut self, kind: Kind, object: &str) {
        self.entries.remove(&(kind, object.to_string()));
    }

    /// Jobs this process created within [`CACHE_LAG`] whose result is not
    /// handled yet: running as far as anyone can tell.
    pub(super) fn recently_created(&self) -> impl Iterator<Item = &str> + '_ {
        self.entries
            .iter()
            .filter(|((kind, name), e)| {
                *kind == Kind::JobCreated
                    && e.at.elapsed() < CACHE_LAG
                    && !self.holds(Kind::JobHandled, name)
            })
            .map(|((_, name), _)| name.as_str())
    }

    /// Drops the entries whose lifetime is over.
    pub(super) fn prune(&mut self) {
        self.entries
            .retain(|(kind, _), e| kind.kept_for().is_none_or(|d| e.at.elapsed() < d));
    }

    /// Queues `node` for a free install slot.
    pub(super) fn queue_install(&mut self, node: &str) {
        self.install_queue.insert(node.to_string());
    }

    /// Takes up to `n` nodes off the install queue.
    pub(super) fn dequeue_installs(&mut self, n: usize) -> Vec<String> {
        let picked: Vec<String> = self.install_queue.iter().take(n).cloned().collect();
        for name in &picked {
            self.install_queue.remove(name);
        }
        picked
    }

    /// Takes an upgrade slot for `node` if one is free and the roll is not
    /// stopped. `busy`: the nodes the caches show upgrading; `max`: the
    /// roll's maxUnavailable as a count.
    pub(super) fn reserve_upgrade(
        &mut self,
        node: &str,
        mut busy: HashSet<String>,
        max: u32,
        stopped: bool,
    ) -> Slot {
        // Started by us, not in the cache yet (or finished and forgotten).
        self.entries.retain(|(kind, n), e| {
            *kind != Kind::UpgradeStarted || busy.contains(n) || e.at.elapsed() < CACHE_LAG
        });
        if self.holds(Kind::UpgradeStarted, node) || busy.contains(node) {
            // Our start patch is on its way through the watch: sending it
            // again would cost a write and an Event.
            return Slot::Started;
        }
        busy.extend(
            self.entries
                .keys()
                .filter(|(kind, _)| *kind == Kind::UpgradeStarted)
                .map(|(_, n)| n.clone()),
        );
        if stopped || busy.len() as u32 >= max {
            self.upgrade_queue.insert(node.to_string());
            return Slot::Full;
        }
        self.upgrade_queue.remove(node);
        self.expect(Kind::UpgradeStarted, node, "");
        Slot::Reserved
    }

    /// The node's upgrade ended: its slot is free, and every node waiting
    /// for one is taken off the queue (to be woken).
    pub(super) fn upgrade_done(&mut self, node: &str) -> Vec<String> {
        self.forget(Kind::UpgradeStarted, node);
        self.upgrade_queue.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_typed_by_kind_object_and_key() {
        let mut e = Expectations::default();
        assert!(e.expect(Kind::JobHandled, "job-a", ""));
        assert!(!e.expect(Kind::JobHandled, "job-a", ""), "already there");
        assert!(!e.holds(Kind::JobCreated, "job-a"));
        e.expect(Kind::Unreadied, "n1", "k1");
        assert!(e.holds_for(Kind::Unreadied, "n1", "k1"));
        assert!(!e.holds_for(Kind::Unreadied, "n1", "k2"));
        e.expect(Kind::Unreadied, "n1", "k2");
        assert!(e.holds_for(Kind::Unreadied, "n1", "k2"), "replaced");
        e.forget(Kind::Unreadied, "n1");
        assert!(!e.holds(Kind::Unreadied, "n1"));
    }

    #[test]
    fn a_created_job_counts_until_handled() {
        let mut e = Expectations::default();
        e.expect(Kind::JobCreated, "a", "");
        e.expect(Kind::JobCreated, "b", "");
        e.expect(Kind::JobHandled, "b", "");
        assert_eq!(e.recently_created().collect::<Vec<_>>(), ["a"]);
        e.prune();
        assert!(e.holds(Kind::JobCreated, "a"), "younger than KEPT");
    }

    #[test]
    fn upgrade_slots_are_counted_with_our_own_starts() {
        let mut e = Expectations::default();
        assert_eq!(
            e.reserve_upgrade("a", HashSet::new(), 1, false),
            Slot::Reserved
        );
        assert_eq!(
            e.reserve_upgrade("a", HashSet::new(), 1, false),
            Slot::Started
        );
        assert_eq!(e.reserve_upgrade("b", HashSet::new(), 1, false), Slot::Full);
        assert_eq!(e.upgrade_done("a"), ["b"]);
        assert_eq!(e.reserve_upgrade("b", HashSet::new(), 1, true), Slot::Full);
        assert_eq!(
            e.reserve_upgrade("b", HashSet::new(), 2, false),
            Slot::Reserved
        );
    }
}
