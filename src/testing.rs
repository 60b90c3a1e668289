//! The one way tests wait for something: check a condition again until it holds, or fail
//! naming it after [`WAIT`]. Compiled into the unit tests (`crate::testing`) and, by path,
//! into the integration tests' `common` and `child` helpers. Not part of the library.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a test waits for a condition before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// How often a condition is checked again.
const EVERY: Duration = Duration::from_millis(10);

/// Blocks until `cond` holds; panics naming `what` after [`WAIT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(EVERY);
    }
}

/// [`wait_until`] for async code: the runtime keeps running between checks.
pub async fn wait_until_async<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(EVERY).await;
    }
}
