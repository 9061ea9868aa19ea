//! change-streamer, the service: configuration, HTTP routes, websocket sessions, and the start
//! and stop of the whole, and its edges: who may connect (`http::access`), TLS (`tls`). The actors themselves live in the `actors` crate (`actors/`).

pub mod config;
pub mod edge;
pub mod http;
pub mod ownership;
pub mod server;
pub mod shutdown;
pub mod standby;
pub mod tls;
pub mod websocket;

pub use config::Config;
pub use server::Service;
