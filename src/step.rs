//! A step's work and its result document, kept apart. The work of detect,
//! resolve, fetch, build, install and verify returns a [`StepResult`]: the
//! status it reached (its outcome a [`Success`]), or the [`Error`] that
//! stopped it together with the status as far as it got (a failed compile
//! still reports its log, a failed download its attempts). [`document`] is
//! the one adapter that makes a step's result document from either; no
//! step writes its outcome by hand.

use crate::error::{Error, Result, Success};
use crate::report::{Document, Kind, Outcome, StatusOutcome};

/// A step that succeeded: why it counts as a success and what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub reason: Success,
    pub message: String,
}

impl Done {
    pub fn new(reason: Success, message: impl Into<String>) -> Self {
        Done {
            reason,
            message: message.into(),
        }
    }
}

impl From<Done> for Outcome {
    fn from(done: Done) -> Self {
        Outcome::new(done.reason, done.message)
    }
}

/// The status of a step's document: where its outcome goes.
pub trait StepStatus: StatusOutcome + Sized {
    /// The document kind it is the status of.
    const KIND: Kind;
    /// The status before the work learnt anything (its outcome says the
    /// step did not finish, which only a bug leaves in a document).
    fn unfinished() -> Self;
    fn set_outcome(&mut self, outcome: Outcome);
}

/// Why a step stopped, and what it had found until then (boxed: a
/// status is large, and the error side of a `Result` should not be).
#[derive(Debug)]
pub struct Stopped<S> {
    pub error: Error,
    pub status: Box<S>,
}

impl<S: StepStatus> Stopped<S> {
    /// Stopped before the work began (bad arguments, an unreadable
    /// catalog): nothing was found.
    pub(crate) fn at_start(error: Error) -> Self {
        Stopped {
            error,
            status: Box::new(S::unfinished()),
        }
    }
}

/// What a step's work returns.
pub(crate) type StepResult<S> = std::result::Result<S, Stopped<S>>;

/// Runs `work`, which fills `status` as it learns, and ends it with the
/// work's success or the error that stopped it.
pub fn attempt<S: StepStatus>(
    mut status: S,
    work: impl FnOnce(&mut S) -> Result<Done>,
) -> StepResult<S> {
    match work(&mut status) {
        Ok(done) => {
            status.set_outcome(done.into());
            Ok(status)
        }
        Err(error) => Err(Stopped {
            error,
            status: Box::new(status),
        }),
    }
}

/// The one adapter from a step's work to its result document: a stop's
/// error becomes the outcome (reason, message and hint), over the status
/// as far as it got.
pub fn document<Spec, S: StepStatus>(spec: Spec, result: StepResult<S>) -> Document<Spec, S> {
    let status = match result {
        Ok(status) => status,
        Err(Stopped { error, mut status }) => {
            status.set_outcome(Outcome::from(&error));
            *status
        }
    };
    Document::new(S::KIND, spec, status)
}

/// A document that did not succeed, as the error that stops what depends
/// on it (its reason and whole message; the plan of a node without a GPU
/// is `NoGpu` too).
pub fn succeeded(outcome: &Outcome) -> Result<()> {
    match outcome.reason.split() {
        Ok(_) => Ok(()),
        Err(failure) => Err(Error::new(failure, outcome.message.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Failure;
    use crate::report::{Phase, Reason};

    #[derive(Debug)]
    struct Status {
        outcome: Outcome,
        seen: Vec<&'static str>,
    }

    impl StatusOutcome for Status {
        fn outcome(&self) -> &Outcome {
            &self.outcome
        }
    }

    impl StepStatus for Status {
        const KIND: Kind = Kind::FetchResult;
        fn unfinished() -> Self {
            Status {
                outcome: Outcome::new(Reason::Internal, "did not finish"),
                seen: Vec::new(),
            }
        }
        fn set_outcome(&mut self, outcome: Outcome) {
            self.outcome = outcome;
        }
    }

    #[test]
    fn a_success_is_the_outcome_and_the_status_is_kept() {
        let result = attempt(Status::unfinished(), |st| {
            st.seen.push("a");
            Ok(Done::new(Success::Fetched, "got it"))
        });
        let doc = document("spec", result);
        assert_eq!(doc.kind, Kind::FetchResult);
        assert_eq!(doc.status.outcome.reason, Reason::Fetched);
        assert_eq!(doc.status.outcome.phase, Phase::Succeeded);
        assert_eq!(doc.status.outcome.message, "got it");
        assert_eq!(doc.status.seen, ["a"]);
    }

    #[test]
    fn a_stop_keeps_what_was_found_and_says_the_error_with_its_hint() {
        let result = attempt(Status::unfinished(), |st| {
            st.seen.push("a");
            Err(Error::new(Failure::ChecksumMismatch, "bad sum").with_hint("check the mirror"))
        });
        let doc = document((), result);
        assert_eq!(doc.status.outcome.reason, Reason::ChecksumMismatch);
        assert_eq!(doc.status.outcome.phase, Phase::Failed);
        assert_eq!(doc.status.outcome.message, "bad sum; check the mirror");
        assert_eq!(doc.status.seen, ["a"]);
        let early = document(
            (),
            Err(Stopped::<Status>::at_start(Error::new(
                Failure::InvalidArgument,
                "no",
            ))),
        );
        assert_eq!(early.status.outcome.reason, Reason::InvalidArgument);
        assert!(early.status.seen.is_empty());
    }
}
