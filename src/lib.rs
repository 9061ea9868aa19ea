//! change-streamer, the service: configuration, HTTP routes, websocket sessions, and the start
//! and stop of the whole. The actors themselves live in the `actors` crate (`actors/`).

pub mod config;
pub mod http;
pub mod ownership;
pub mod server;
pub mod shutdown;
pub mod websocket;

pub use config::Config;
pub use server::Service;
