//! [`IsResetRequired`] and [`IsUpstreamSilent`]: the streamer's part of `/readyz` (PROTOCOL.md
//! §11), questions as cheap as the probe is frequent.
//!
//! ### Why not `GetStreamerState`
//! `/readyz` only needs to know whether the change source said `reset-required` since its last
//! new transaction (PROTOCOL.md §4). `GetStreamerState` answers `/status`: it builds a record of
//! every subscriber, with their ids and rates, which costs a streamer with a thousand
//! subscribers that many allocations in its own turn at every probe.

use actix::prelude::*;

use super::Streamer;

/// Asks whether the change source said `reset-required` and has sent no new transaction since.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "bool")]
pub struct IsResetRequired;

impl Handler<IsResetRequired> for Streamer {
    type Result = bool;
    fn handle(&mut self, _: IsResetRequired, _: &mut Context<Self>) -> bool {
        self.reset_required.is_some()
    }
}

/// Asks whether the last connection to the change source ended by a silence, or the last
/// connect timed out, with no connection since (PROTOCOL.md §4, [`super::UpstreamLink`]).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "bool")]
pub struct IsUpstreamSilent;

impl Handler<IsUpstreamSilent> for Streamer {
    type Result = bool;
    fn handle(&mut self, _: IsUpstreamSilent, _: &mut Context<Self>) -> bool {
        self.upstream_down.as_ref().is_some_and(|d| d.silent)
    }
}
