//! Idempotent injects: an `Idempotency-Key` (REST header, `/ws` `idempotency_key`) names an
//! inject; the same key from the same principal (and tenant) with the same body, within
//! `limits.idempotency_window_ms`, is answered the first answer again and creates nothing;
//! with another body, 409 `idempotency_conflict`. Of concurrent duplicates one injects and
//! the others wait for its answer. A key whose inject failed is not kept (the client may
//! try again). Kept in memory for the window (at most `limits.max_idempotency_keys` per
//! tenant) and in the store (`store::idempotency`), read back at start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use sha2::{Digest, Sha256};

use super::auth::Seen;
use super::error::ApiError;
use crate::config::Limits;
use crate::pump::{InjectReceipt, Organism};
use crate::store::idempotency::KeyRow;
use crate::sync::lock;
use crate::time::Timestamp;

/// Longest idempotency key, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// Whose key it is: (tenant, principal, key).
type Slot = (String, String, String);

enum Entry {
    /// Being injected: the body's hash, and where its answer will come.
    Running([u8; 32], tokio::sync::watch::Receiver<Option<Kept>>),
    Done(Kept),
}

#[derive(Clone)]
struct Kept {
    hash: [u8; 32],
    thread_id: String,
    message_id: String,
    at: Timestamp,
}

/// The keys of one API server.
#[derive(Default)]
pub struct Keys {
    table: Mutex<Table>,
}

/// The keys, and how many each tenant has.
#[derive(Default)]
struct Table {
    map: HashMap<Slot, Entry>,
    counts: HashMap<String, usize>,
}

impl Table {
    fn add(&mut self, slot: Slot, e: Entry) {
        let tenant = slot.0.clone();
        if self.map.insert(slot, e).is_none() {
            *self.counts.entry(tenant).or_default() += 1;
        }
    }

    fn remove(&mut self, slot: &Slot) {
        if self.map.remove(slot).is_some() {
            if let Some(n) = self.counts.get_mut(&slot.0) {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Lets go of the keys past the window.
    fn sweep(&mut self, now: Timestamp, window: u64) {
        let old: Vec<Slot> = self
            .map
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Done(k) if now.0.saturating_sub(k.at.0) >= window))
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in old {
            self.remove(&slot);
        }
    }

    /// Takes `slot` for an inject under way, unless its tenant keeps as many keys as it may
    /// (past the window's first).
    fn claim(
        &mut self,
        slot: &Slot,
        e: Entry,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<(), ApiError> {
        let max = limits.max_idempotency_keys;
        let count = |t: &Table| t.counts.get(&slot.0).copied().unwrap_or(0);
        if count(self) >= max {
            self.sweep(now, limits.idempotency_window_ms);
        }
        let n = count(self);
        if n >= max {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_idempotency_keys",
                format!(
                    "{n} idempotency keys are kept for this tenant (limits.max_idempotency_keys); \
                     retry without a key, or once older keys leave the window"
                ),
            ));
        }
        self.add(slot.clone(), e);
        Ok(())
    }
}

/// What a key stands at.
enum Look {
    Answer(Result<Once, ApiError>),
    Wait(tokio::sync::watch::Receiver<Option<Kept>>),
    New,
}

/// What a keyed inject came to.
pub struct Once {
    pub receipt: InjectReceipt,
    /// True when this is the first answer again.
    pub replayed: bool,
}

/// The key, checked: 1 to [`MAX_KEY_BYTES`] bytes of visible ASCII.
pub fn checked_key(key: &str) -> Result<&str, ApiError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(format!(
            "an idempotency key is 1 to {MAX_KEY_BYTES} visible ASCII characters"
        ))
        .at("Idempotency-Key"));
    }
    Ok(key)
}

/// The hash that says two bodies are the same: of the body as parsed, written again (so
/// spacing and key order do not count).
pub fn body_hash(body: &impl serde::Serialize) -> [u8; 32] {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Sha256::digest(&bytes).into()
}

fn conflict() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_conflict",
        "this idempotency key was used with a different body: use a new key for a new inject",
    )
    .at("Idempotency-Key")
}

impl Keys {
    /// Knows again the keys the store kept within the window.
    pub fn load(organism: &Organism) -> Keys {
        let keys = Keys::default();
        let Some(store) = organism.history().store() else {
            return keys;
        };
        let limits = organism.config().limits;
        let since = Timestamp(
            organism
                .now()
                .0
                .saturating_sub(limits.idempotency_window_ms),
        );
        let rows = match store.keys_since(since, limits.max_idempotency_keys.saturating_mul(64)) {
            Ok(rows) => rows,
            Err(e) => {
                // Said, and the server starts without them: a request retried with a key
                // from before this start runs again.
                let error =
                    format!("the idempotency keys kept in the store could not be read back: {e}");
                tracing::warn!("{error}");
                organism.say_error(error);
                Vec::new()
            }
        };
        let mut table = lock(&keys.table);
        for r in rows {
            let kept = Kept {
                hash: r.body_hash,
                thread_id: r.thread_id,
                message_id: r.message_id,
                at: r.created,
            };
            table.add((r.tenant, r.principal, r.key), Entry::Done(kept));
        }
        drop(table);
        keys
    }

    /// What `slot` stands at for a body of `hash`, now.
    fn look(&self, slot: &Slot, hash: [u8; 32], now: Timestamp, window: u64) -> Look {
        let mut table = lock(&self.table);
        match table.map.get(slot) {
            Some(Entry::Done(k)) if now.0.saturating_sub(k.at.0) < window => {
                Look::Answer(replay(k, hash))
            }
            Some(Entry::Done(_)) => {
                table.remove(slot);
                Look::New
            }
            Some(Entry::Running(h, _)) if *h != hash => Look::Answer(Err(conflict())),
            Some(Entry::Running(_, rx)) => Look::Wait(rx.clone()),
            None => Look::New,
        }
    }

    /// Injects once per key: `run` does the inject, unless the key's first answer (or one
    /// under way) is there to be given again.
    pub async fn once(
        &self,
        organism: &Organism,
        seen: &Seen,
        key: &str,
        hash: [u8; 32],
        run: impl FnOnce() -> Result<InjectReceipt, ApiError>,
    ) -> Result<Once, ApiError> {
        let p = &seen.principal;
        let slot: Slot = (
            p.tenant.clone().unwrap_or_default(),
            p.name.clone().unwrap_or_default(),
            checked_key(key)?.to_string(),
        );
        let limits = organism.config().limits;
        let window = limits.idempotency_window_ms;
        let (now, tx) = loop {
            let now = organism.now();
            match self.look(&slot, hash, now, window) {
                Look::Answer(a) => return a,
                // Another request with this key is injecting: its answer is this one's; if
                // it failed, nothing was kept, and this one may inject.
                Look::Wait(mut rx) => {
                    let answered = rx
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|k| k.clone());
                    if let Some(k) = answered {
                        return replay(&k, hash);
                    }
                }
                Look::New => {
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    let mut table = lock(&self.table);
                    if !table.map.contains_key(&slot) {
                        table.claim(&slot, Entry::Running(hash, rx), now, &limits)?;
                        break (now, tx);
                    }
                }
            }
        };
        // No await from the claim to the answer: a request dropped meanwhile cannot leave
        // the key claimed.
        let result = run();
        let mut table = lock(&self.table);
        let receipt = match result {
            Ok(receipt) => receipt,
            Err(e) => {
                // Dropping `tx` tells the waiters nothing was kept.
                table.remove(&slot);
                return Err(e);
            }
        };
        let kept = Kept {
            hash,
            thread_id: receipt.thread_id.to_string(),
            message_id: receipt.message_id.to_string(),
            at: now,
        };
        if let Some(store) = organism.history().store() {
            let row = KeyRow {
                tenant: slot.0.clone(),
                principal: slot.1.clone(),
                key: slot.2.clone(),
                body_hash: hash,
                thread_id: kept.thread_id.clone(),
                message_id: kept.message_id.clone(),
                created: now,
            };
            store.keep_key(row, Timestamp(now.0.saturating_sub(window)));
        }
        table.map.insert(slot, Entry::Done(kept.clone()));
        let _ = tx.send(Some(kept));
        Ok(Once {
            receipt,
            replayed: false,
        })
    }
}

/// The first answer again, if `hash` is the first body's.
fn replay(k: &Kept, hash: [u8; 32]) -> Result<Once, ApiError> {
    if k.hash != hash {
        return Err(conflict());
    }
    Ok(Once {
        receipt: InjectReceipt {
            thread_id: Arc::from(k.thread_id.as_str()),
            message_id: Arc::from(k.message_id.as_str()),
        },
        replayed: true,
    })
}

/// An inject from the API (REST or `/ws`): once per key when `key` is given.
pub async fn inject(
    keys: &Keys,
    organism: &Organism,
    seen: &Seen,
    default: &str,
    body: super::inject::InjectBody,
    key: Option<&str>,
) -> Result<Once, ApiError> {
    let Some(key) = key else {
        return Ok(Once {
            receipt: super::inject::inject(organism, seen, default, body)?,
            replayed: false,
        });
    };
    let hash = body_hash(&body);
    keys.once(organism, seen, key, hash, || {
        super::inject::inject(organism, seen, default, body)
    })
    .await
}
