//! change-streamer, the service: configuration, HTTP routes, websocket sessions, the instance's
//! life ([`instance`]: the owner's actors in [`owner`], a serving standby's in [`standby`]), and
//! its edges: who may connect (`http::access`), TLS (`tls`), and what is re-read without a
//! restart (`reload`). The actors themselves live in the
//! `actors` crate (`actors/`).

pub mod config;
pub mod edge;
pub mod http;
pub mod instance;
pub mod log_format;
pub mod owner;
pub mod reload;
pub mod shutdown;
pub mod standby;
pub mod start_error;
pub mod tls;
pub mod websocket;

pub use config::Config;
pub use instance::Instance;
pub use start_error::StartError;
