//! Tasks every homing worker has: `builtin.noop` (benchmarks), `builtin.sleep`, and
//! `builtin.http` (call an HTTP endpoint with the job id as idempotency key: the way to drive an
//! external inference server). `builtin.webhook` delivers events; it needs the process's webhook
//! configuration, so it is registered separately ([`webhook::Webhook::new`]).

#[cfg(feature = "http")]
pub mod http;
pub mod noop;
pub mod sleep;
#[cfg(feature = "http")]
pub mod webhook;

use crate::task::Registry;

/// A registry holding every built-in task.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(noop::Noop).register(sleep::Sleep);
    #[cfg(feature = "http")]
    r.register(http::Http);
    r
}
