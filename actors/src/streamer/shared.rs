//! [`SharedFrames`]: the frames of one streamer turn's live changes, queued once for every
//! subscriber that gets all of them ([`Subscriber::queue`](super::subscriber::Subscriber)
//! keeps each subscriber's run of them), handed to sessions as a [`FrameList`], which also
//! serializes its batched frames (PROTOCOL.md §5) once for all the sessions that write them.

use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use super::session_messages::{Outgoing, Token};

/// The most payloads in one batched frame (PROTOCOL.md §5).
pub const BATCH_MAX_PAYLOADS: usize = 256;
/// The most payload text in one batched frame, unless one payload alone is larger.
pub const BATCH_MAX_BYTES: usize = 1 << 20;

/// A list of frames handed to a session ([`ToSession::Send`](super::ToSession)): often the
/// same list for every live subscriber.
///
/// ### Why the batches are serialized here, once
/// A batched subscriber (`wsBatched=true`) gets the list as `{"batch":[P1,…],"id":n}` frames;
/// the payload text between the brackets is the same for every subscriber that got the list,
/// only `n` differs. So the list keeps the joined text of each of its batches, built by the
/// first session that writes it (on its own thread, not the streamer's) and read by the
/// others; a session only adds `{"batch":[`, `],"id":n}` around it.
#[derive(Debug, Default)]
pub struct FrameList {
    frames: Vec<Outgoing>,
    batches: OnceLock<Vec<Batch>>,
}

/// One batched frame of a [`FrameList`]: its frames (a range of the list) and their payloads
/// joined by commas.
#[derive(Debug)]
pub struct Batch {
    pub frames: std::ops::Range<usize>,
    pub payloads: String,
}

impl FrameList {
    pub fn new(frames: Vec<Outgoing>) -> FrameList {
        FrameList {
            frames,
            batches: OnceLock::new(),
        }
    }

    /// The list cut into batched frames of at most [`BATCH_MAX_PAYLOADS`] payloads and
    /// [`BATCH_MAX_BYTES`] of payload text (one larger payload is a batch alone), in order;
    /// built on first use.
    pub fn batches(&self) -> &[Batch] {
        self.batches.get_or_init(|| cut(&self.frames))
    }
}

impl Deref for FrameList {
    type Target = [Outgoing];
    fn deref(&self) -> &[Outgoing] {
        &self.frames
    }
}

/// Cuts `frames` into batches (see [`FrameList::batches`]).
fn cut(frames: &[Outgoing]) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut start = 0;
    while start < frames.len() {
        let (mut end, mut bytes) = (start, 0);
        while end < frames.len() && end - start < BATCH_MAX_PAYLOADS {
            let len = frames[end].message.len();
            if end > start && bytes + len > BATCH_MAX_BYTES {
                break;
            }
            bytes += len;
            end += 1;
        }
        let mut payloads = String::with_capacity(bytes + (end - start));
        for (i, f) in frames[start..end].iter().enumerate() {
            if i > 0 {
                payloads.push(',');
            }
            payloads.push_str(&f.message);
        }
        batches.push(Batch {
            frames: start..end,
            payloads,
        });
        start = end;
    }
    batches
}

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
    use crate::streamer::change::{Change, Kind};
    use crate::streamer::session_messages::ToSession;
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
            for c in &changes {
                for &i in &order {
                    subs[i].0.send_live(c, None, &mut shared);
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

    fn frame(text: &str) -> Outgoing {
        Outgoing {
            message: Arc::from(text),
            commit: None,
            token: None,
        }
    }

    #[test]
    fn batches_hold_at_most_256_payloads_and_1_mib_unless_one_payload_is_larger() {
        let small: Vec<Outgoing> = (0..600).map(|i| frame(&format!("[{i}]"))).collect();
        let list = FrameList::new(small);
        let sizes: Vec<usize> = list.batches().iter().map(|b| b.frames.len()).collect();
        assert_eq!(sizes, [256, 256, 88]);
        assert_eq!(
            list.batches()[0].payloads,
            (0..256)
                .map(|i| format!("[{i}]"))
                .collect::<Vec<_>>()
                .join(",")
        );

        let big = "x".repeat(BATCH_MAX_BYTES / 3);
        let huge = "y".repeat(BATCH_MAX_BYTES + 1);
        let list = FrameList::new(vec![
            frame(&big),
            frame(&big),
            frame(&big),
            frame(&big),
            frame(&huge),
            frame("[1]"),
        ]);
        let ranges: Vec<_> = list.batches().iter().map(|b| b.frames.clone()).collect();
        assert_eq!(ranges, [0..3, 3..4, 4..5, 5..6]);
        assert!(FrameList::new(Vec::new()).batches().is_empty());
    }
}
