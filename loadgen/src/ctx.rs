//! What the subscriber tasks of one thread share ([`Ctx`], built from the run's [`Setup`]), and
//! how they subscribe ([`Framing`]): what the crew (`crew.rs`) hands the subscribers
//! (`subscriber.rs`) it starts. Which of them churn is the crew's to know (`churn.rs` drives
//! its joiners with a `Ctx`), not the context's.

use std::sync::Arc;
use std::time::Instant;

use crate::shared::{Run, ServiceAccess};
use crate::tally::{Counters, Tally};

/// How a subscriber subscribes and acks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// One ack per frame, in order (zero 0.26.2's client).
    PerFrame,
    /// `wsBatched=true`: both shapes, one cumulative ack per read.
    Batched,
}

/// What the subscriber tasks of one thread share.
pub struct Ctx {
    pub run: Arc<Run>,
    pub tally: Tally,
    pub access: ServiceAccess,
    /// `data` changes per transaction, as the change source sends them.
    pub changes: usize,
    pub framing: Framing,
    /// Subscribing is given up after this.
    pub deadline: Instant,
}

/// How every thread's subscribers subscribe (each thread gets its copy).
#[derive(Clone)]
pub struct Setup {
    pub access: ServiceAccess,
    pub changes: usize,
    pub framing: Framing,
    pub deadline: Instant,
}

impl Setup {
    pub fn ctx(&self, run: Arc<Run>, counters: Arc<Counters>) -> Ctx {
        Ctx {
            run,
            tally: Tally::new(counters),
            access: self.access.clone(),
            changes: self.changes,
            framing: self.framing,
            deadline: self.deadline,
        }
    }
}

#[cfg(test)]
impl Setup {
    /// The context the checks' tests read frames in: batched frames of 10-insert
    /// transactions, no secret, one thread's counters.
    pub fn batched_for_tests() -> Ctx {
        let setup = Setup {
            access: ServiceAccess {
                secret: None,
                tls: None,
                read_buffer: 128 * 1024,
            },
            changes: 10,
            framing: Framing::Batched,
            deadline: Instant::now(),
        };
        setup.ctx(Arc::new(Run::new()), Arc::new(Counters::new(1)))
    }
}
