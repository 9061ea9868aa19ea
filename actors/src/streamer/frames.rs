//! The frames a streamer hands its sessions: one [`Outgoing`] per message with what its ack
//! means ([`Token`]), in [`FrameList`]s handed over as [`ToSession`]; a list also serializes
//! its batched frames (PROTOCOL.md §5) once for all the sessions that write them. The vocabulary that the streamer's frame
//! queues (`shared.rs`, `subscriber/`) and its messages to sessions (`session_messages.rs`)
//! both speak.

use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use bytes::Bytes;

use crate::session_end::SessionEnd;
use crate::watermark::Watermark;

/// One frame for a session to write, with what its ack means.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The message JSON (`["data",{...}]`); the session wraps it as `{"msg":…,"id":n}`.
    pub message: Arc<str>,
    /// Set on commits: acking this frame acks that commit watermark.
    pub commit: Option<Watermark>,
    /// Set on tracked frames: report this token when acked.
    pub token: Option<Token>,
}

/// What the ack of a tracked frame lets go on. Numbered, so that an ack for a tracked frame
/// that no longer waits (an earlier broadcast) is told apart from the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Token {
    /// The tracked send of a broadcast: its ack counts towards the release (flow control).
    Broadcast(u64),
    /// A frame whose ack only tells the streamer how far the client has read, so that what it
    /// holds for the subscriber is known inside long transactions too, and a catch-up's window
    /// reopens (PROTOCOL.md §10.2).
    Progress,
}

/// From the streamer to a subscriber's session.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum ToSession {
    /// Write these frames, in order. Often the same list for every live subscriber (see
    /// `shared.rs`).
    Send(Arc<FrameList>),
    /// Close the socket.
    Close(SessionEnd),
}

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
/// others; a session only adds `{"batch":[`, `],"id":n}` around it. The text is kept as
/// [`Bytes`], so that a session hands the very same bytes to its socket's writer, without a
/// copy of its own.
#[derive(Debug, Default)]
pub struct FrameList {
    frames: Vec<Outgoing>,
    batches: OnceLock<Vec<Batch>>,
}

/// One batched frame of a [`FrameList`]: its frames (a range of the list), their payloads
/// joined by commas, and what acking it means, summed once for every session that writes it.
#[derive(Debug)]
pub struct Batch {
    pub frames: std::ops::Range<usize>,
    /// UTF-8 text: the payloads (each a JSON text) joined by commas.
    pub payloads: Bytes,
    /// Bytes of payload of its frames (their messages, without the commas between them).
    pub bytes: u64,
    /// The last commit watermark among its frames: acking the batch acks it.
    pub commit: Option<Watermark>,
    /// The tokens of its tracked frames, in order.
    pub tokens: Vec<Token>,
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
        let (mut commit, mut tokens) = (None, Vec::new());
        for (i, f) in frames[start..end].iter().enumerate() {
            if i > 0 {
                payloads.push(',');
            }
            payloads.push_str(&f.message);
            if f.commit.is_some() {
                commit.clone_from(&f.commit);
            }
            tokens.extend(f.token);
        }
        batches.push(Batch {
            frames: start..end,
            payloads: Bytes::from(payloads),
            bytes: bytes as u64,
            commit,
            tokens,
        });
        start = end;
    }
    batches
}

#[cfg(test)]
mod tests {
    //! How a frame list is cut into batched frames (PROTOCOL.md §5).
    use super::*;

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
                .as_bytes()
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

    #[test]
    fn a_batch_sums_its_payload_bytes_its_last_commit_and_its_tokens_once_for_every_session() {
        let w = |n| Some(Watermark::from_u64(n));
        let mut frames: Vec<Outgoing> = (0..300).map(|i| frame(&format!("[{i}]"))).collect();
        frames[10].commit = w(1);
        frames[20].token = Some(Token::Progress);
        frames[30].commit = w(2);
        frames[30].token = Some(Token::Broadcast(7));
        frames[299].commit = w(3);
        let list = FrameList::new(frames);
        let [first, second] = list.batches() else {
            panic!("two batches")
        };
        let bytes =
            |r: std::ops::Range<usize>| list[r].iter().map(|f| f.message.len() as u64).sum();
        assert_eq!(first.bytes, bytes(0..256));
        assert_eq!(first.commit, w(2));
        assert_eq!(first.tokens, [Token::Progress, Token::Broadcast(7)]);
        assert_eq!((second.bytes, &second.commit), (bytes(256..300), &w(3)));
        assert!(second.tokens.is_empty());
    }
}
