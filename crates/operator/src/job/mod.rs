//! The Jobs the operator creates. One pod per Job, pinned to its node with
//! `nodeName` (no scheduler decision, and no DaemonSet per kernel):
//!
//! - init container `copy-installer` (installer image, unprivileged): the
//!   static installer copies itself into an emptyDir;
//! - container `installer` (the node's builder image: headers and the
//!   kernel's compiler): `gpu-driver-installer run` on the host through
//!   `/proc/1/root` (hostPID), privileged because it loads kernel modules
//!   and makes device nodes. It needs no other mount and no API access.
//!
//! Build Jobs (with a cache) are the other shape: scheduled onto any node
//! of the target's architecture that tolerates them, not privileged, no
//! hostPID, no host mount; `gpu-driver-installer prebuild` compiles for the
//! target in its builder image and stores the artifact. Only they get the
//! cache's write credentials (`cache.writeSecretName`); install Jobs get
//! the read-only Secret (`cache.secretName`) and `--cache-read-only`.
//!
//! Files: `request` (what the controller asks for), `object` (the Job
//! around the pod), `pod` (the pod spec of each kind), `args` (the
//! installer's command line), `layout` (paths inside the pod), `example`
//! (what `job-template` prints).

mod args;
mod example;
mod layout;
mod object;
mod pod;
mod request;

pub(crate) use example::example;
pub use example::{NoJob, TemplateKind};
pub use object::build;
pub use request::JobRequest;

#[cfg(test)]
mod tests;
