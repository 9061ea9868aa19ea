//! [`SharedFrames`]: the frames of one streamer turn's live changes, queued once for every
//! subscriber that gets all of them ([`Subscriber::queue`](super::subscriber::Subscriber)
//! keeps each subscriber's run of them), handed to sessions as one [`FrameList`].

use std::sync::Arc;

use super::frames::{FrameList, Outgoing, Token};

/// The frames of the live changes forwarded in the current streamer turn, kept once for all
/// the subscribers that get every one of them.
///
/// ### Why one frame list for all
/// Live subscribers almost always get the same frames: the same changes, the same commit
/// watermarks, the same tracked token. Building a list per subscriber cost, per change and
/// subscriber, a copy of the frame and a reference count taken here and dropped on a session's
/// thread. So the frames are queued once, each subscriber only notes the run of them it got,
/// and at the end of the turn they are handed, as one shared list, to every session whose run
/// is the whole list. A subscriber that gets a different sequence (a change filtered for it,
/// a catch-up frame) has its own list for the rest of the turn.
#[derive(Default)]
pub struct SharedFrames {
    pub(super) frames: Vec<Outgoing>,
    /// Live changes forwarded since start, for [`SharedFrames::progress_mark`].
    live: u64,
}

impl SharedFrames {
    /// A [`Token::Progress`] on every `every`-th live change, so that a subscriber's session
    /// reports how far its client read inside long transactions too (PROTOCOL.md §10.2); the same
    /// change carries it for every subscriber, so that the frames stay shared.
    pub fn progress_mark(&mut self, every: u64) -> Option<Token> {
        self.live += 1;
        (self.live % every.max(1) == 0).then_some(Token::Progress)
    }

    /// Takes the turn's frames, as the one list handed to every session that got them all.
    pub fn take(&mut self) -> Arc<FrameList> {
        Arc::new(FrameList::new(std::mem::take(&mut self.frames)))
    }
}

#[cfg(test)]
mod tests {
    //! The shared frame list: subscribers that get every live change share one list; one that
    //! is filtered from a change gets its own, complete and in order, whatever its place in
    //! the iteration.
    use super::*;
    use crate::session_end::SessionId;
    use crate::streamer::budget::Budget;
    use crate::streamer::change::{Change, Kind};
    use crate::streamer::frames::ToSession;
    use crate::streamer::subscriber::{Bounds, Mode, Phase, Subscriber};
    use crate::watermark::Watermark;
    use actix::prelude::*;
    use tokio::sync::mpsc;

    struct Recorder(mpsc::UnboundedSender<Arc<FrameList>>);
    impl Actor for Recorder {
        type Context = Context<Self>;
    }
    impl Handler<ToSession> for Recorder {
        type Result = ();
        fn handle(&mut self, msg: ToSession, _: &mut Context<Self>) {
            if let ToSession::Send(frames) = msg {
                let _ = self.0.send(frames);
            }
        }
    }

    fn live(n: u64, protocol: u32) -> (Subscriber, mpsc::UnboundedReceiver<Arc<FrameList>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let session = Recorder(tx).start().recipient();
        let w = Watermark::from_u64(1);
        let mut s = Subscriber::new(
            SessionId(n),
            n.to_string(),
            Mode::Serving,
            protocol,
            w,
            session,
            Bounds {
                changes: 100,
                bytes: 1 << 20,
            },
        );
        s.phase = Phase::Live;
        (s, rx)
    }

    fn texts(frames: &[Outgoing]) -> Vec<&str> {
        frames.iter().map(|f| &*f.message).collect()
    }

    #[actix_rt::test]
    async fn subscribers_getting_every_change_share_one_list_and_a_filtered_one_gets_its_own() {
        let w = Watermark::from_u64(2);
        let changes = [
            Change::new(Kind::Begin, w.clone(), 0, r#"{"tag":"begin"}"#),
            Change::new(Kind::Data, w.clone(), 1, r#"{"tag":"insert"}"#),
            Change::new(
                Kind::Data,
                w.clone(),
                2,
                r#"{"tag":"update-table-metadata"}"#,
            ),
            Change::new(Kind::Data, w.clone(), 3, r#"{"tag":"delete"}"#),
            Change::new(Kind::Commit, w, 4, r#"{"tag":"commit"}"#),
        ]
        .map(Arc::new);
        // The v4 subscriber comes first, between and last in the iteration.
        for order in [[0, 1, 2], [1, 0, 2], [1, 2, 0]] {
            let mut subs = [live(1, 4), live(2, 6), live(3, 6)];
            let mut shared = SharedFrames::default();
            let mut budget = Budget::new(u64::MAX / 2, 0);
            for c in &changes {
                for &i in &order {
                    subs[i].0.send_live(c, None, &mut shared, &mut budget);
                }
            }
            let batch = shared.take();
            for (s, _) in &mut subs {
                s.flush_turn(0.0, &batch);
            }
            let mut got = Vec::new();
            for (_, rx) in &mut subs {
                got.push(rx.recv().await.expect("frames"));
            }
            let all: Vec<&str> = changes.iter().map(|c| &*c.message).collect();
            assert_eq!(texts(&got[1]), all);
            assert!(Arc::ptr_eq(&got[1], &batch) && Arc::ptr_eq(&got[2], &batch));
            let v4: Vec<&str> = all
                .iter()
                .copied()
                .filter(|m| !m.contains("metadata"))
                .collect();
            assert_eq!(texts(&got[0]), v4, "order {order:?}");
            assert!(got[0].last().is_some_and(|f| f.commit.is_some()));
        }
    }
}
