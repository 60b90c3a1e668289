//! A tenant's reads take turns: one at a time among all its credentials' (every `GET`, and
//! the batches, which find what they act on by a filter), so one tenant's slow reads (each
//! up to `limits.max_query_ms`) hold at most one of the store's read connections
//! (`store::readers`), and every other tenant's reads, and the organism's, go on. Its next
//! ones wait for their turn (each on its own connection, bounded by
//! `limits.max_connections`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Each tenant with a request under way or waiting: its one turn.
#[derive(Default)]
pub(super) struct Turns(Mutex<HashMap<Arc<str>, Arc<Semaphore>>>);

/// A request's turn: let go of (and the tenant's entry with it, once no request of the
/// tenant holds or waits for it) however the request ends, a client gone included.
struct Turn<'a> {
    turns: &'a Turns,
    tenant: Arc<str>,
    one: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Turns {
    /// Runs `request` in `tenant`'s turn.
    pub(super) async fn take<F: Future>(&self, tenant: &str, request: F) -> F::Output {
        let (tenant, one) = {
            let mut map = crate::sync::lock(&self.0);
            match map.get_key_value(tenant) {
                Some((t, one)) => (t.clone(), one.clone()),
                None => {
                    let t: Arc<str> = Arc::from(tenant);
                    let one = Arc::new(Semaphore::new(1));
                    map.insert(t.clone(), one.clone());
                    (t, one)
                }
            }
        };
        let mut turn = Turn {
            turns: self,
            tenant,
            one: one.clone(),
            permit: None,
        };
        // Never closed: `Err` cannot come, and the request would then go on without a turn.
        turn.permit = one.acquire_owned().await.ok();
        request.await
    }

    /// Tenants with a request under way or waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        crate::sync::lock(&self.0).len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut map = crate::sync::lock(&self.turns.0);
        // The map's and this one's: no other request holds or waits for it.
        if Arc::strong_count(&self.one) == 2 {
            map.remove(&self.tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The attacker is acme with a request that does not end; beta's go on, acme's next
    /// waits for it, and nothing is kept once they are done or given up.
    #[tokio::test]
    async fn one_tenants_long_request_holds_its_own_turn_only() {
        let turns = Arc::new(Turns::default());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let long = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take("acme", released).await.is_ok() }
        });
        let limit = crate::testing::WAIT;
        crate::testing::wait_until_async("acme's long request in its turn", || async {
            turns.len() == 1
        })
        .await;
        assert_eq!(turns.take("beta", async { 7 }).await, 7, "beta goes on");
        assert_eq!(turns.take("beta", async { 8 }).await, 8);
        // acme's next waits for its turn (given up here: its entry stays for the long one).
        let next = turns.take("acme", async { 9 });
        assert!(tokio::time::timeout(Duration::from_millis(100), next)
            .await
            .is_err());
        assert_eq!(turns.len(), 1);
        let after = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take("acme", async { 10 }).await }
        });
        release.send(()).unwrap();
        assert!(long.await.unwrap());
        assert_eq!(
            tokio::time::timeout(limit, after).await.unwrap().unwrap(),
            10
        );
        assert_eq!(turns.len(), 0, "nothing kept once done");
    }
}
