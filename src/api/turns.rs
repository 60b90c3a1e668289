//! Reads take turns, so that no credential's slow reads (each up to `limits.max_query_ms`)
//! hold up the others' or the pump's (every `GET`, and the batches, which find what they act
//! on by a filter). A tenant's go one at a time among all its credentials'; all tenants'
//! together hold at most [`TENANT_READS`] of the store's read connections
//! (`store::READERS`), the organism's own credentials' at most [`OWN_READS`], and everyone's
//! at most [`API_READS`]: each side always has one, and one is always left for the pump's
//! look-ups on an inject. A read waits for its turn (on its own connection, bounded by
//! `limits.max_connections`); none is refused.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::store::READERS;

/// Tenants' reads under way at once, at most.
pub(super) const TENANT_READS: usize = READERS - 2;
/// The organism's own credentials' reads under way at once, at most.
pub(super) const OWN_READS: usize = READERS - 2;
/// Every credential's reads under way at once, at most: a connection left for the pump.
pub(super) const API_READS: usize = READERS - 1;

// One connection is the pump's; neither side can take the other's last one.
const _: () = assert!(API_READS < READERS && TENANT_READS < API_READS && OWN_READS < API_READS);

/// Each tenant with a request under way or waiting: its one turn; and the turns each side,
/// and everyone, may hold at once.
pub(super) struct Turns {
    tenants: Mutex<HashMap<Arc<str>, Arc<Semaphore>>>,
    tenant_reads: Arc<Semaphore>,
    own_reads: Arc<Semaphore>,
    all: Arc<Semaphore>,
}

impl Default for Turns {
    fn default() -> Self {
        Turns {
            tenants: Mutex::default(),
            tenant_reads: Arc::new(Semaphore::new(TENANT_READS)),
            own_reads: Arc::new(Semaphore::new(OWN_READS)),
            all: Arc::new(Semaphore::new(API_READS)),
        }
    }
}

/// A request's turn: let go of (and its tenant's entry with it, once no request of the
/// tenant holds or waits for it) however the request ends, a client gone included.
struct Turn<'a> {
    turns: &'a Turns,
    /// The tenant and its one turn (`None`: the organism's own credential).
    tenant: Option<(Arc<str>, Arc<Semaphore>)>,
    /// The tenant's turn (if any), then its side's, then everyone's.
    permits: [Option<OwnedSemaphorePermit>; 3],
}

impl Turns {
    /// Runs `request` in its turn: `tenant`'s, or (`None`) the organism's own.
    pub(super) async fn take<F: Future>(&self, tenant: Option<&str>, request: F) -> F::Output {
        let tenant = tenant.map(|tenant| {
            let mut map = crate::sync::lock(&self.tenants);
            match map.get_key_value(tenant) {
                Some((t, one)) => (t.clone(), one.clone()),
                None => {
                    let t: Arc<str> = Arc::from(tenant);
                    let one = Arc::new(Semaphore::new(1));
                    map.insert(t.clone(), one.clone());
                    (t, one)
                }
            }
        });
        let side = match tenant {
            Some(_) => &self.tenant_reads,
            None => &self.own_reads,
        };
        let mut turn = Turn {
            turns: self,
            tenant,
            permits: [None, None, None],
        };
        // Never closed: `Err` cannot come, and the request would then go on without a turn.
        if let Some((_, one)) = &turn.tenant {
            turn.permits[0] = one.clone().acquire_owned().await.ok();
        }
        turn.permits[1] = side.clone().acquire_owned().await.ok();
        turn.permits[2] = self.all.clone().acquire_owned().await.ok();
        request.await
    }

    /// Tenants with a request under way or waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        crate::sync::lock(&self.tenants).len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.permits = [None, None, None];
        let Some((tenant, one)) = &self.tenant else {
            return;
        };
        let mut map = crate::sync::lock(&self.turns.tenants);
        // The map's and this one's: no other request holds or waits for it.
        if Arc::strong_count(one) == 2 {
            map.remove(tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `request` is still waiting for its turn 100 ms on.
    async fn waits(request: impl Future) {
        let waited = tokio::time::timeout(Duration::from_millis(100), request).await;
        assert!(waited.is_err(), "the request went without its turn");
    }

    /// Requests that do not end until their sender is dropped, one for each of `tenants`
    /// (`None`: the organism's own); the senders, and whether each ran in its turn.
    fn hold(
        turns: &Arc<Turns>,
        tenants: impl IntoIterator<Item = Option<String>>,
    ) -> (
        Vec<tokio::sync::oneshot::Sender<()>>,
        Vec<tokio::task::JoinHandle<bool>>,
    ) {
        let mut releases = Vec::new();
        let mut long = Vec::new();
        for tenant in tenants {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            releases.push(release);
            let turns = turns.clone();
            long.push(tokio::spawn(async move {
                turns.take(tenant.as_deref(), released).await.is_ok()
            }));
        }
        (releases, long)
    }

    /// The attacker is acme with a request that does not end; beta's go on, acme's next
    /// waits for it, and nothing is kept once they are done or given up.
    #[tokio::test]
    async fn one_tenants_long_request_holds_its_own_turn_only() {
        let turns = Arc::new(Turns::default());
        let (mut release, mut long) = hold(&turns, [Some("acme".to_string())]);
        let limit = crate::testing::WAIT;
        crate::testing::wait_until_async("acme's long request in its turn", || async {
            turns.len() == 1
        })
        .await;
        assert_eq!(
            turns.take(Some("beta"), async { 7 }).await,
            7,
            "beta goes on"
        );
        assert_eq!(turns.take(Some("beta"), async { 8 }).await, 8);
        // acme's next waits for its turn (given up here: its entry stays for the long one).
        waits(turns.take(Some("acme"), async { 9 })).await;
        assert_eq!(turns.len(), 1);
        let after = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Some("acme"), async { 10 }).await }
        });
        release.pop().unwrap().send(()).unwrap();
        assert!(long.pop().unwrap().await.unwrap());
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
        let (mut releases, long) = hold(&turns, (0..TENANT_READS).map(|i| Some(format!("t{i}"))));
        crate::testing::wait_until_async("every tenant's turn held", || async {
            turns.tenant_reads.available_permits() == 0
        })
        .await;
        waits(turns.take(Some("another"), async { 1 })).await;
        let after = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(Some("another"), async { 2 }).await }
        });
        drop(releases.pop());
        let waited = tokio::time::timeout(crate::testing::WAIT, after).await;
        assert_eq!(waited.unwrap().unwrap(), 2);
        drop(releases);
        for l in long {
            l.await.unwrap();
        }
        assert_eq!(turns.tenant_reads.available_permits(), TENANT_READS);
    }

    /// The attacker is an organism-wide viewer with endless reads: it holds at most
    /// [`OWN_READS`] connections, a tenant's read still goes (the last of [`API_READS`]),
    /// and one is left for the pump; the organism's next read waits for one of its own.
    #[tokio::test]
    async fn the_organisms_own_reads_leave_a_connection_for_tenants_and_the_pump() {
        let turns = Arc::new(Turns::default());
        let (releases, long) = hold(&turns, (0..OWN_READS).map(|_| None));
        crate::testing::wait_until_async("the organism's turns held", || async {
            turns.own_reads.available_permits() == 0
        })
        .await;
        waits(turns.take(None, async { 1 })).await;
        // A tenant's read goes on (the last of everyone's); while it is under way, nothing
        // else gets a connection.
        let (mut release, mut tenant) = hold(&turns, [Some("acme".to_string())]);
        crate::testing::wait_until_async("acme's read under way", || async {
            turns.all.available_permits() == 0
        })
        .await;
        waits(turns.take(Some("beta"), async { 2 })).await;
        release.pop().unwrap().send(()).unwrap();
        assert!(tenant.pop().unwrap().await.unwrap());
        let beta = turns.take(Some("beta"), async { 3 });
        let waited = tokio::time::timeout(crate::testing::WAIT, beta).await;
        assert_eq!(waited.unwrap(), 3);
        drop(releases);
        for l in long {
            l.await.unwrap();
        }
        assert_eq!(turns.all.available_permits(), API_READS);
    }
}
