//! [`RawFrames`]: websocket text frames a session hands to its connection's writer already
//! encoded, in pieces, the payload text shared with every other session that writes it.
//!
//! ### Why
//! A batched frame's payload text (`{"batch":[P1,…],"id":n}` without its brackets and id) is the
//! same for every subscriber that gets the list ([`FrameList::batches`]). Written through the
//! session's websocket context it was copied three times per subscriber before the socket's
//! own copy: into the session's frame text, by the websocket encoder into its buffer, and by
//! the HTTP writer into its write buffer; at 64 subscribers those copies were the largest
//! single cost of a delivery in the profile. Here a session encodes only what is its own (the
//! frame header, `{"batch":[`, `],"id":n}`) and hands the shared text itself along, as a
//! reference-counted [`Bytes`]; the HTTP writer's copy is the only one left.
//!
//! ### Order with the context's own frames
//! Pings, pongs and close frames still go through the context ([`ws::WebsocketContext`]).
//! [`RawBody`] wraps the response body (the context, and the shutdown's close frame around
//! it): every time it polls the context, which runs the session's handlers, it first yields
//! what those handlers queued here, then what the context encoded in the same poll. A handler
//! queues whole frames, so a close (the session's, or the shutdown's) comes after the data
//! written before it and never inside a frame.
//!
//! [`FrameList::batches`]: change_streamer_actors::streamer::FrameList::batches
//! [`ws::WebsocketContext`]: actix_web_actors::ws::WebsocketContext

use std::cell::RefCell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::HttpResponse;
use bytes::{BufMut, Bytes, BytesMut};

/// The frames a session queued for its connection, in pieces (shared between the session and
/// its [`RawBody`], both run by the connection's one task).
#[derive(Clone, Default)]
pub struct RawFrames {
    queue: Rc<RefCell<VecDeque<Bytes>>>,
}

impl RawFrames {
    /// Starts queuing frames: the session's own bytes go into one buffer, cut where a shared
    /// piece goes between them ([`Writer::text_frame`]); [`Writer::finish`] queues the rest.
    pub fn writer(&self, frames: usize) -> Writer<'_> {
        Writer {
            raw: self,
            own: BytesMut::with_capacity(frames * 40),
        }
    }

    #[cfg(test)]
    fn take(&self) -> Vec<Bytes> {
        self.queue.borrow_mut().drain(..).collect()
    }
}

/// Queues text frames for one write ([`RawFrames::writer`]).
pub struct Writer<'a> {
    raw: &'a RawFrames,
    own: BytesMut,
}

impl Writer<'_> {
    /// Queues one unmasked server text frame (RFC 6455 §5.2) whose payload is `head`, then
    /// `shared` (UTF-8, as the whole payload must be), then `tail`.
    pub fn text_frame(&mut self, head: &[u8], shared: &Bytes, tail: &[u8]) {
        let len = head.len() + shared.len() + tail.len();
        self.own.put_u8(0x81); // FIN, text
        match len {
            0..=125 => self.own.put_u8(len as u8),
            126..=0xFFFF => {
                self.own.put_u8(126);
                self.own.put_u16(len as u16);
            }
            _ => {
                self.own.put_u8(127);
                self.own.put_u64(len as u64);
            }
        }
        self.own.put_slice(head);
        let mut queue = self.raw.queue.borrow_mut();
        queue.push_back(self.own.split().freeze());
        if !shared.is_empty() {
            queue.push_back(shared.clone());
        }
        self.own.put_slice(tail);
    }

    /// Queues what is left of the session's own bytes (the last frame's tail).
    pub fn finish(mut self) {
        if !self.own.is_empty() {
            let rest = self.own.split().freeze();
            self.raw.queue.borrow_mut().push_back(rest);
        }
    }
}

/// `response` (a websocket upgrade) whose body also yields what is queued in `raw`, before what
/// the body itself yields in the same poll (see the module documentation).
pub fn with_raw_frames(response: HttpResponse, raw: RawFrames) -> HttpResponse {
    response
        .map_body(|_, body| RawBody {
            body,
            raw,
            stash: None,
            ended: false,
        })
        .map_into_boxed_body()
}

/// The response body of [`with_raw_frames`].
pub struct RawBody {
    body: BoxBody,
    raw: RawFrames,
    /// What the body yielded, kept until the frames queued in the same poll are out.
    stash: Option<Result<Bytes, <BoxBody as MessageBody>::Error>>,
    ended: bool,
}

impl MessageBody for RawBody {
    type Error = <BoxBody as MessageBody>::Error;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(piece) = this.raw.queue.borrow_mut().pop_front() {
                return Poll::Ready(Some(Ok(piece)));
            }
            if let Some(item) = this.stash.take() {
                return Poll::Ready(Some(item));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.body).poll_next(cx) {
                Poll::Ready(Some(item)) => this.stash = Some(item),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending if this.raw.queue.borrow().is_empty() => return Poll::Pending,
                Poll::Pending => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The frames as a client reads them: header, then the payload of the stated length.
    use super::*;

    /// Decodes unmasked server frames: (FIN and opcode byte, payload) each.
    fn decode(mut wire: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut frames = Vec::new();
        while !wire.is_empty() {
            let (first, len_byte) = (wire[0], wire[1] & 0x7F);
            let (len, at) = match len_byte {
                126 => (u16::from_be_bytes([wire[2], wire[3]]) as usize, 4),
                127 => {
                    let mut n = [0u8; 8];
                    n.copy_from_slice(&wire[2..10]);
                    (u64::from_be_bytes(n) as usize, 10)
                }
                n => (n as usize, 2),
            };
            frames.push((first, wire[at..at + len].to_vec()));
            wire = &wire[at + len..];
        }
        frames
    }

    #[test]
    fn raw_text_frames_carry_each_length_form_and_share_the_payload() {
        let raw = RawFrames::default();
        let small = Bytes::from_static(b"[1],[2]");
        let medium = Bytes::from(vec![b'x'; 300]);
        let large = Bytes::from(vec![b'y'; 70_000]);
        let mut w = raw.writer(3);
        w.text_frame(b"{\"batch\":[", &small, b"],\"id\":1}");
        w.text_frame(b"{\"msg\":", &medium, b",\"id\":2}");
        w.text_frame(b"{\"batch\":[", &large, b"],\"id\":3}");
        w.finish();
        let pieces = raw.take();
        assert!(
            pieces.iter().any(|p| p.as_ptr() == large.as_ptr()),
            "shared, not copied"
        );
        let wire: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let frames = decode(&wire);
        let texts: Vec<String> = frames
            .iter()
            .map(|(first, payload)| {
                assert_eq!(*first, 0x81);
                String::from_utf8(payload.clone()).expect("utf-8")
            })
            .collect();
        assert_eq!(texts[0], r#"{"batch":[[1],[2]],"id":1}"#);
        assert_eq!(texts[1], format!(r#"{{"msg":{},"id":2}}"#, "x".repeat(300)));
        assert_eq!(texts[2].len(), 70_000 + r#"{"batch":[],"id":3}"#.len());
        assert_eq!(frames.len(), 3);
    }
}
