//! The command an event was caused by (`origin {request_id, conn}` in its frame).
//!
//! A client's command runs inside [`Cause::scope`] (async) or [`Cause::enter`] (sync: a
//! blocking task, or code that does not await); every event the hub publishes meanwhile, on
//! that task or thread, carries the cause. So an inject's `thread_created` and `message`,
//! a kill's `thread_updated` and a decision's `input_resolved` name the request that made
//! them, with no parameter threaded through the pump. Events a handler's work makes later
//! (its replies) carry none: their message's `origin {kind: reply, of}` names their cause.

use std::future::Future;
use std::sync::Arc;

/// A request's id as the client sent it (a JSON string or number) and the `/ws`
/// connection it came on, if it did.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub request_id: serde_json::Value,
    pub conn: Option<Arc<str>>,
}

/// The longest request id, in bytes (`X-Request-Id`, a `/ws` command's `request_id`).
pub const MAX_REQUEST_ID: usize = 128;

tokio::task_local! {
    static CURRENT: Option<Arc<Cause>>;
}

impl Cause {
    /// The cause of events published now, on this task or thread.
    pub fn current() -> Option<Arc<Cause>> {
        CURRENT.try_with(Clone::clone).ok().flatten()
    }

    /// Runs `f` with `cause` as the cause of what it publishes.
    pub async fn scope<F: Future>(cause: Option<Arc<Cause>>, f: F) -> F::Output {
        CURRENT.scope(cause, f).await
    }

    /// Runs the synchronous `f` with `cause` as the cause of what it publishes (in a blocking
    /// task, pass [`Cause::current`] taken before it was spawned).
    pub fn enter<R>(cause: Option<Arc<Cause>>, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(cause, f)
    }
}

/// `tokio::task::spawn_blocking`, the task running as the cause of the caller.
pub fn spawn_blocking<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> tokio::task::JoinHandle<R> {
    let cause = Cause::current();
    tokio::task::spawn_blocking(move || Cause::enter(cause, f))
}

/// Whether `id` may name a request: printable ASCII, 1 to [`MAX_REQUEST_ID`] bytes.
pub fn valid_request_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_REQUEST_ID && id.bytes().all(|b| (0x21..0x7f).contains(&b))
}
