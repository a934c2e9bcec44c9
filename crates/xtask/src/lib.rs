//! What the xtask shares with the integration tests (tests/it): the VM
//! console's parser and checks. Everything else stays in the binary.

pub mod vmlog;
