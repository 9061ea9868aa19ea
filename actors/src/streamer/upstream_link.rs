//! [`UpstreamLink`]: the upstream client tells the streamer whether it holds a connection to the
//! change source and, when not, why (PROTOCOL.md §4, "Liveness" and "Connect timeout"), for
//! `/status` (`upstream.disconnectReason`) and `/readyz` (`upstream silent`, §11).
//!
//! Kept apart from [`super::UpstreamEvent`], which drives ingest (a transaction cut off is
//! rolled back): this is only what an operator is shown.

use actix::prelude::*;

use super::Streamer;

/// Why the service holds no connection to its change source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamDown {
    /// The end of the last connection or the last failed connect, as logged.
    pub reason: String,
    /// The end was a silence: no pong and no frame for two ping intervals, or a connect that
    /// timed out (PROTOCOL.md §4). `/readyz` answers `upstream silent` while so.
    pub silent: bool,
}

/// The upstream client's connection changed: `Up` once a handshake succeeded, `Down` after
/// every end of a connection and every failed connect.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub enum UpstreamLink {
    Up,
    Down(UpstreamDown),
}

impl Handler<UpstreamLink> for Streamer {
    type Result = ();
    fn handle(&mut self, link: UpstreamLink, _: &mut Context<Self>) {
        self.upstream_down = match link {
            UpstreamLink::Up => None,
            UpstreamLink::Down(down) => Some(down),
        };
    }
}
