//! The owner's commits as a standby hears them (PROTOCOL.md §14.1): after each commit group the
//! owner's writer sends the group's last watermark on [`COMMITS_CHANNEL`] in the transaction
//! that stores it (so the notice comes when, and only if, it commits); a standby `LISTEN`s on a
//! connection of its own and reads the new rows when told.
//!
//! Notices are hints, not the data: one lost (the connection dropped, or PostgreSQL's queue
//! overflowed) costs latency only, because the follower also reads what is new at every poll
//! and whenever its listening connection is made anew.

use futures_util::StreamExt;
use log::{debug, warn};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::connection::with_causes;
use super::types::ChangeLogError;
use super::COMMITS_CHANNEL;
use crate::watermark::Watermark;

/// The owner's commit notices, while the connection that hears them lasts.
pub struct CommitNotices {
    notices: mpsc::UnboundedReceiver<Watermark>,
    /// Keeps the listening session open.
    _client: Client,
}

impl CommitNotices {
    /// Listens for the owner's commits on the change DB at `url`, on a connection driven on
    /// the current runtime.
    pub async fn listen(url: &str) -> Result<CommitNotices, ChangeLogError> {
        let config: Config = url.parse()?;
        let (client, mut connection) = config.connect(NoTls).await?;
        let (tx, notices) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => match Watermark::parse(n.payload()) {
                        Ok(w) => {
                            if tx.send(w).is_err() {
                                return; // nobody listens any more
                            }
                        }
                        Err(_) => warn!(
                            "change DB: ignoring a commit notice that is no watermark: {:?}",
                            n.payload()
                        ),
                    },
                    Ok(other) => debug!("change DB listener: {other:?}"),
                    Err(e) => {
                        warn!("change DB listener connection ended: {}", with_causes(&e));
                        return;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {COMMITS_CHANNEL}"))
            .await?;
        Ok(CommitNotices {
            notices,
            _client: client,
        })
    }

    /// The next notice; `None` once the listening connection ended.
    pub async fn next(&mut self) -> Option<Watermark> {
        self.notices.recv().await
    }

    /// The notices as a stream, ending with the connection.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Watermark> {
        futures_util::stream::unfold(self, |mut n| async move { n.next().await.map(|w| (w, n)) })
    }
}
