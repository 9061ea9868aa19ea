//! How a subscriber reads each frame ([`Reader`]): with every check (`subscriber.rs`'s `Check`)
//! or light (`light.rs`'s `Light`), both driven by the subscriber's one read loop. A file of its
//! own so that the light reader does not need the subscriber that drives it.

use crate::ctx::Ctx;

/// How a subscriber reads each frame.
pub trait Reader {
    /// Reads one frame's text; the id to ack, or `None` when the subscription cannot go on.
    fn frame(&mut self, ctx: &Ctx, text: &str) -> Option<u64>;
    /// The subscriber's name, for errors.
    fn name(&self) -> &str;
}
