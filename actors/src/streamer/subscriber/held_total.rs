//! [`HeldTotal`]: the payload bytes all of a streamer's subscribers hold together
//! (PROTOCOL.md §10.2, `--max-queued-bytes`), as a running total.

use std::cell::Cell;
use std::rc::Rc;

/// The payload bytes all of a streamer's subscribers hold (PROTOCOL.md §10.2), kept up to date
/// by each subscriber as what it holds changes, so that the global budget is known at every
/// admission without summing every subscriber (which cost, per change forwarded, a pass over
/// all of them). Shared by the streamer and its subscribers only, all on the streamer's thread.
#[derive(Debug, Clone, Default)]
pub struct HeldTotal(Rc<Cell<u64>>);

impl HeldTotal {
    pub fn get(&self) -> u64 {
        self.0.get()
    }

    /// `n` more bytes are held, by subscribers whose own counts follow later (a cohort's
    /// members, `cohort.rs`).
    pub(in crate::streamer) fn add(&self, n: u64) {
        self.0.set(self.0.get() + n);
    }

    /// What one subscriber holds went from `before` to `after`.
    pub(super) fn change(&self, before: u64, after: u64) {
        self.0.set(self.0.get() + after - before);
    }
}

#[cfg(test)]
mod tests {
    //! The running total follows what each subscriber holds: what it is sent, what it acks,
    //! and its leaving.
    use std::sync::Arc;

    use actix::prelude::*;

    use super::super::{Bounds, Mode, Phase, Subscriber};
    use super::HeldTotal;
    use crate::session_end::SessionId;
    use crate::streamer::budget::Budget;
    use crate::streamer::change::{Change, Kind};
    use crate::streamer::frames::ToSession;
    use crate::streamer::shared::SharedFrames;
    use crate::watermark::Watermark;

    struct Sink;
    impl Actor for Sink {
        type Context = Context<Self>;
    }
    impl Handler<ToSession> for Sink {
        type Result = ();
        fn handle(&mut self, _: ToSession, _: &mut Context<Self>) {}
    }

    fn live(n: u64, total: &HeldTotal) -> Subscriber {
        let bounds = Bounds {
            changes: 100,
            bytes: 1 << 20,
        };
        let session = Sink.start().recipient();
        let w = Watermark::from_u64(1);
        let mut s = Subscriber::new(
            SessionId(n),
            n.to_string(),
            Mode::Serving,
            6,
            w,
            session,
            bounds,
        );
        s.phase = Phase::Live;
        s.share_total(total);
        s
    }

    #[actix_rt::test]
    async fn the_global_budget_total_follows_sends_acks_and_departures() {
        let total = HeldTotal::default();
        let (mut a, mut b) = (live(1, &total), live(2, &total));
        let w = Watermark::from_u64(2);
        let begin = Arc::new(Change::new(Kind::Begin, w.clone(), 0, r#"{"tag":"begin"}"#));
        let data = Arc::new(Change::new(Kind::Data, w, 1, r#"{"tag":"insert"}"#));
        let (mut shared, mut budget) = (SharedFrames::default(), Budget::new(u64::MAX / 2, 0));
        for c in [&begin, &data] {
            a.send_live(c, None, &mut shared, &mut budget);
            b.send_live(c, None, &mut shared, &mut budget);
        }
        let each = (begin.message.len() + data.message.len()) as u64;
        assert_eq!(total.get(), 2 * each);
        a.progress(1, begin.message.len() as u64, None);
        assert_eq!(total.get(), 2 * each - begin.message.len() as u64);
        b.leave_total();
        assert_eq!(total.get(), a.held_bytes());
    }
}
