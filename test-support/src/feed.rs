//! Feeding a [`Streamer`] upstream messages in-process, as the upstream client does: in
//! batches, handing back what the streamer did not take, and waiting on each release of flow
//! control before sending more (PROTOCOL.md §10). For actor-level measurements and benchmarks that
//! drive the real streamer without a change source.

use std::collections::VecDeque;

use actix::Addr;
use change_streamer_actors::streamer::{Streamer, UpstreamBatch};
use change_streamer_actors::upstream::protocol::UpstreamMessage;

/// Sends `msgs` to `streamer` in batches of at most `batch` messages; answers how many times it
/// waited on a release (tracked sends waited on).
pub async fn feed(streamer: &Addr<Streamer>, msgs: Vec<UpstreamMessage>, batch: usize) -> u64 {
    let mut waits = 0;
    let mut rest: VecDeque<UpstreamMessage> = msgs.into();
    while !rest.is_empty() {
        let n = batch.min(rest.len());
        let b: Vec<UpstreamMessage> = rest.drain(..n).collect();
        let reply = streamer
            .send(UpstreamBatch(b))
            .await
            .expect("the streamer is running")
            .expect("the streamer takes valid upstream messages");
        for m in reply.rest.into_iter().rev() {
            rest.push_front(m);
        }
        if let Some(r) = reply.release {
            waits += 1;
            let _ = r.await;
        }
    }
    waits
}
