//! What the service does when it stops owning a shared PostgreSQL change DB (SPEC §14).
//!
//! The change log's PostgreSQL engine holds ownership and fences every write
//! ([`change_streamer_actors::ownership`]); once it finds it was deposed it refuses every
//! further write, so nothing more is stored or acked upstream. The service then exits with
//! [`EXIT_DEPOSED`]: the process's end closes the upstream connection and every session at
//! once, and whoever supervises it starts it again, as a standby. (Closing the sessions with
//! 1011 and standing by inside the same process is not built yet.)

use change_streamer_actors::changelog::ChangeLog;
use log::error;

/// The exit status of an owner that lost the change DB (`EX_TEMPFAIL`: start it again).
pub const EXIT_DEPOSED: i32 = 75;

/// Exits the process once `log`'s engine reports this instance no longer owns the change DB.
pub fn exit_when_deposed(log: ChangeLog) {
    actix_rt::spawn(async move {
        log.deposed().await;
        error!(
            "no longer the owner of change DB {}: exiting ({EXIT_DEPOSED}) to start again as a standby",
            log.path().display()
        );
        std::process::exit(EXIT_DEPOSED);
    });
}
