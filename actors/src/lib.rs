//! The actors of change-streamer, and the pieces they are made of.
//!
//! The backup side: [`monitor::MonitorActor`] polls litestream and reports what is backed up;
//! [`cleanup::CleanupActor`] decides when the change log may be cleaned up;
//! [`reservation::ReservationActor`] holds the snapshot reservations that pause it. The change
//! side: [`upstream`] reads the change source, [`streamer`] stores each transaction in the
//! [`changelog`] and broadcasts it to subscribers with consensus flow control, and purges the
//! log when the [`purger`] finds a scheduled cleanup safe. [`session_end`] is what both sides
//! know of a websocket session: its number and why it ends; [`secret`] a shared secret
//! that is never printed. Each actor owns its state; they
//! talk by the typed messages defined beside them, and each stops on its own `Stop` message.
//! [`instance`] is this instance among those sharing a change DB: its id and its record there;
//! [`unreachable`] how a part that retries the change DB says an outage once.
//! Time comes from an injected [`clock::Clock`] or, for timers, the runtime's (pausable) clock.

pub mod alarm;
pub mod changelog;
pub mod cleanup;
pub mod clock;
pub mod follower;
pub mod instance;
pub mod litestream;
pub mod litestream_control;
pub mod monitor;
pub mod ownership;
pub mod purger;
pub mod reservation;
pub mod restart_catch_up;
pub mod secret;
pub mod session_end;
pub mod stall;
pub mod streamer;
pub mod unreachable;
pub mod upstream;
pub mod vfs;
pub mod vfs_env;
pub mod vfs_reader;
pub mod watermark;
