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
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::connection::{named, settle, with_causes, within, Bounds, Session};
use super::types::ChangeLogError;
use super::COMMITS_CHANNEL;
use crate::watermark::Watermark;

/// The owner's commit notices, while the connection that hears them lasts. Only the newest
/// is kept: a follower busy elsewhere (waiting for its subscribers) misses nothing by reading
/// up to it later, and holds no queue of notices however long it waits.
pub struct CommitNotices {
    newest: watch::Receiver<Option<Watermark>>,
    /// Keeps the listening session open.
    _client: Client,
}

impl CommitNotices {
    /// Listens for the owner's commits on the change DB at `url`, on a connection driven on
    /// the current runtime.
    pub async fn listen(url: &str) -> Result<CommitNotices, ChangeLogError> {
        let config = named(&url.parse::<Config>()?, "listen");
        let bounds = Bounds::current();
        let (client, mut connection) = within(bounds.statement(), config.connect(NoTls)).await?;
        let (tx, newest) = watch::channel(None);
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => match Watermark::parse(n.payload()) {
                        Ok(w) => {
                            let newer = tx.send_if_modified(|n| {
                                let newer = n.as_ref().is_none_or(|n| w > *n);
                                if newer {
                                    *n = Some(w);
                                }
                                newer
                            });
                            if newer && tx.is_closed() {
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
        // The server's side of the bounds too (PROTOCOL.md §14.2, a silent change DB).
        settle(&client, Session::Other).await?;
        let listen = format!("LISTEN {COMMITS_CHANNEL}");
        within(bounds.call(), client.batch_execute(&listen)).await?;
        Ok(CommitNotices {
            newest,
            _client: client,
        })
    }

    /// The newest notice not yet seen (waiting for one); `None` once the listening connection
    /// ended.
    pub async fn next(&mut self) -> Option<Watermark> {
        self.newest.changed().await.ok()?;
        self.newest.borrow_and_update().clone()
    }

    /// The newest notice not yet seen, if one came (without waiting); an ended connection
    /// shows at the next [`next`](Self::next).
    pub fn newest_now(&mut self) -> Option<Watermark> {
        match self.newest.has_changed() {
            Ok(true) => self.newest.borrow_and_update().clone(),
            _ => None,
        }
    }
}
