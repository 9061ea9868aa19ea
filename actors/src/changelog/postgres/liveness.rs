//! Whether the owner's writer waits on a slow change DB or a silent one (PROTOCOL.md §14.2, a
//! silent change DB): a writer's call may rightly take long (the commit of a large
//! transaction, a purge waiting for a lock), so the writer has no `statement_timeout`; instead a
//! call still unanswered after [`Bounds::late`] asks, on a connection of its own (`probe`, made
//! at the first late call and kept), whether the server is working on the writer's session
//! (`pg_stat_activity` `state = 'active'`). A server that says so is slow, and the call goes on
//! (asked again every [`Bounds::probe`]); one that does not answer within [`Bounds::probe`], or
//! says twice in a row that the session is not working (it waits for the writer, whose
//! messages or answers are lost), is silent: the call fails with [`ChangeLogError::Silent`].

use std::cell::RefCell;
use std::future::Future;

use tokio::time::{timeout, Instant};
use tokio_postgres::{Client, Config};

use super::connection::{connect, named, within, Bounds, Session};
use super::types::ChangeLogError;

/// The probe of one writer session, on the writer's thread (shared there by `Rc`, so that a
/// call of the writer's that borrows it whole can be heard).
pub(super) struct Probe {
    config: Config,
    /// The writer session's backend, as `pg_stat_activity` shows it.
    writer_pid: i32,
    /// The probe's connection, taken out while it asks.
    client: RefCell<Option<Client>>,
}

impl Probe {
    /// The probe of the writer session on `writer` (its backend pid asked once, now), which
    /// connects with `config` when first needed.
    pub(super) async fn of(config: &Config, writer: &Client) -> Result<Probe, ChangeLogError> {
        let bound = Bounds::current().call();
        let row = within(bound, writer.query_one("SELECT pg_backend_pid()", &[])).await?;
        Ok(Probe {
            config: named(config, "probe"),
            writer_pid: row.get(0),
            client: RefCell::new(None),
        })
    }

    /// `call`'s answer, however long a working server takes; [`ChangeLogError::Silent`] once
    /// the change DB is found silent (see the module documentation).
    pub(super) async fn heard<T, E>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ChangeLogError>
    where
        ChangeLogError: From<E>,
    {
        let b = Bounds::current();
        let started = Instant::now();
        tokio::pin!(call);
        if let Ok(answer) = timeout(b.late(), &mut call).await {
            return Ok(answer?);
        }
        let mut idle_seen = false;
        loop {
            match timeout(b.probe(), self.working()).await {
                Ok(Ok(true)) => idle_seen = false,
                Ok(Ok(false)) if !idle_seen => idle_seen = true,
                _ => return Err(ChangeLogError::Silent(started.elapsed())),
            }
            if let Ok(answer) = timeout(b.probe(), &mut call).await {
                return Ok(answer?);
            }
        }
    }

    /// Whether the server says the writer's session is working on a statement.
    async fn working(&self) -> Result<bool, ChangeLogError> {
        let kept = self.client.borrow_mut().take();
        let client = match kept.filter(|c| !c.is_closed()) {
            Some(c) => c,
            None => connect(&self.config, Session::Other).await?,
        };
        let row = client
            .query_opt(
                "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1",
                &[&self.writer_pid],
            )
            .await?;
        *self.client.borrow_mut() = Some(client);
        Ok(row
            .and_then(|r| r.get::<_, Option<bool>>(0))
            .unwrap_or(false))
    }
}
