//! Text messages from the change source, whole: fragmented ones reassembled, other frames
//! sorted into what ends the connection (a close, a binary frame) and what is ignored here
//! (pings and pongs, which the session handles itself). PROTOCOL.md §4.

use actix_http::ws::Item;
use awc::ws::Frame;
use bytes::{Bytes, BytesMut};

use super::ConnectionEnd;

/// Reassembles fragmented text messages.
#[derive(Default)]
pub(super) struct Fragments(Option<BytesMut>);

/// The text of a whole message, checked as UTF-8 where it lies: a frame's bytes are not
/// copied to be read.
pub(super) fn utf8(bytes: &[u8]) -> Result<&str, ConnectionEnd> {
    std::str::from_utf8(bytes)
        .map_err(|_| ConnectionEnd::Violation("text frame is not UTF-8".into()))
}

impl Fragments {
    /// Returns the bytes of a whole text message, `Ok(None)` for a non-text frame to ignore, or
    /// an error.
    pub(super) fn take(&mut self, frame: Frame) -> Result<Option<Bytes>, ConnectionEnd> {
        match frame {
            Frame::Text(b) => Ok(Some(b)),
            Frame::Continuation(Item::FirstText(b)) => {
                self.0 = Some(BytesMut::from(&b[..]));
                Ok(None)
            }
            Frame::Continuation(Item::Continue(b)) => {
                self.0
                    .as_mut()
                    .ok_or_else(|| ConnectionEnd::Violation("stray continuation".into()))?
                    .extend_from_slice(&b);
                Ok(None)
            }
            Frame::Continuation(Item::Last(b)) => {
                let mut all = self
                    .0
                    .take()
                    .ok_or_else(|| ConnectionEnd::Violation("stray continuation".into()))?;
                all.extend_from_slice(&b);
                Ok(Some(all.freeze()))
            }
            Frame::Binary(_) | Frame::Continuation(Item::FirstBinary(_)) => {
                Err(ConnectionEnd::Violation("binary frame".into()))
            }
            Frame::Ping(_) | Frame::Pong(_) => Ok(None),
            Frame::Close(reason) => Err(ConnectionEnd::Closed(
                reason
                    .map(|r| format!(" ({:?} {})", r.code, r.description.unwrap_or_default()))
                    .unwrap_or_default(),
            )),
        }
    }
}
