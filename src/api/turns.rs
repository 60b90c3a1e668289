//! A tenant's reads take turns: one at a time among all its credentials' (every `GET`, and
//! the batches, which find what they act on by a filter), and all tenants' together one
//! fewer at once than the store has read connections (`store::READERS`). So one tenant's
//! slow reads (each up to `limits.max_query_ms`) hold at most one connection, every other
//! tenant's reads go on, and one connection is always left for the organism's own (its
//! credentials' reads, and the pump's look-ups on an inject). A tenant's next reads wait
//! for their turn (each on its own connection, bounded by `limits.max_connections`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Each tenant with a request under way or waiting: its one turn; and the turns all
/// tenants may hold at once.
pub(super) struct Turns(Mutex<HashMap<Arc<str>, Arc<Semaphore>>>, Arc<Semaphore>);

/// Tenants' reads under way at once, at most: a connection left for the organism's.
pub(super) const TENANT_READS: usize = crate::store::READERS - 1;

impl Default for Turns {
    fn default() -> Self {
        Turns(Mutex::default(), Arc::new(Semaphore::new(TENANT_READS)))
    }
}

/// A request's turn: let go of (and the tenant's entry with it, once no request of the
/// tenant holds or waits for it) however the request ends, a client gone included.
struct Turn<'a> {
    turns: &'a Turns,
    tenant: Arc<str>,
    one: Arc<Semaphore>,
    /// The tenant's turn, then one of all tenants'.
    permits: [Option<OwnedSemaphorePermit>; 2],
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
            permits: [None, None],
        };
        // Never closed: `Err` cannot come, and the request would then go on without a turn.
        turn.permits[0] = one.acquire_owned().await.ok();
        turn.permits[1] = self.1.clone().acquire_owned().await.ok();
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
        self.permits = [None, None];
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

    /// Tenants' long requests hold one fewer connection than the store has: the next
    /// tenant's waits for one of them, so one is always left for the organism's reads.
    #[tokio::test]
    async fn tenants_together_leave_a_connection_for_the_organism() {
        let turns = Arc::new(Turns::default());
        let mut releases = Vec::new();
        let mut long = Vec::new();
        for i in 0..TENANT_READS {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            releases.push(release);
            let turns = turns.clone();
            long.push(tokio::spawn(async move {
                turns.take(&format!("t{i}"), released).await.is_ok()
            }));
        }
        crate::testing::wait_until_async("every tenant's turn held", || async {
            turns.1.available_permits() == 0
        })
        .await;
        let next = turns.take("another", async { 1 });
        assert!(tokio::time::timeout(Duration::from_millis(100), next)
            .await
            .is_err());
        let after = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take("another", async { 2 }).await }
        });
        drop(releases.pop());
        let waited = tokio::time::timeout(crate::testing::WAIT, after).await;
        assert_eq!(waited.unwrap().unwrap(), 2);
        drop(releases);
        for l in long {
            l.await.unwrap();
        }
        assert_eq!(turns.1.available_permits(), TENANT_READS);
    }
}
