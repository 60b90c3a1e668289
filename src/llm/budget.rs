//! Token budgets of tenants (`tenants.X.tokens_per_day`, `tokens_per_month`, UTC windows):
//! before a call, what it may take (its prompt, estimated, and `max_tokens`) is reserved
//! against each window of its listener's tenant, or the call is refused before it is made;
//! after it, the reservation becomes what the call took. A window's use starts from the
//! usage account ([`UsageSource`], the store's daily sums), so a restart or pruning
//! messages reopens nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use crate::config::Tenants;
use crate::time::Timestamp;

/// The tokens a tenant's listeners used between two days (inclusive, `YYYY-MM-DD`), as
/// accounted.
pub trait UsageSource: Send + Sync {
    fn used(&self, tenant: &str, from: &str, to: &str) -> u64;
    /// The tokens `listener`'s calls took in `thread`.
    fn used_in_thread(&self, listener: &str, thread: &str) -> u64;
}

/// Threads' accounts kept at once; past it, one not in use is forgotten (and read again
/// from the usage account when next asked for).
pub const MAX_THREAD_ACCOUNTS: usize = 10_000;

/// A budget window: one UTC day or month of one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Window {
    tenant: String,
    /// `tokens_per_day` or `tokens_per_month`.
    key: &'static str,
    /// `YYYY-MM-DD` or `YYYY-MM`.
    period: String,
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    used: u64,
    reserved: u64,
}

/// Why a call may not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget: tenants.{tenant}.{key} ({limit} tokens) reached; resets {resets_at}")]
pub struct Exhausted {
    pub tenant: String,
    pub key: &'static str,
    pub limit: u64,
    /// RFC 3339, the window's end.
    pub resets_at: String,
    /// Seconds until then.
    pub retry_after: u64,
}

/// Every tenant's windows, for the organism.
pub struct Budgets {
    tenants: RwLock<Tenants>,
    accounts: Mutex<HashMap<Window, Account>>,
    /// Each (listener, thread)'s account, for `budget.tokens_per_thread`.
    threads: Mutex<HashMap<(String, String), Account>>,
    source: Option<Arc<dyn UsageSource>>,
}

/// Tokens held against a thread's budget for a call until it ends.
#[must_use]
pub struct ThreadHold {
    key: (String, String),
    tokens: u64,
}

/// One window of a tenant, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowState {
    pub tenant: String,
    /// `tokens_per_day` or `tokens_per_month`.
    pub key: &'static str,
    /// `YYYY-MM-DD` or `YYYY-MM` (UTC).
    pub period: String,
    pub limit: u64,
    pub used: u64,
    /// Held for calls under way.
    pub reserved: u64,
    pub remaining: u64,
    /// RFC 3339: the window's end.
    pub resets_at: String,
}

/// Tokens held for a call until it ends.
#[must_use]
pub struct Reservation {
    windows: Vec<Window>,
    tokens: u64,
}

impl Budgets {
    pub fn new(tenants: Tenants, source: Option<Arc<dyn UsageSource>>) -> Budgets {
        Budgets {
            tenants: RwLock::new(tenants),
            accounts: Mutex::default(),
            threads: Mutex::default(),
            source,
        }
    }

    /// The limits as a reload leaves them.
    pub fn set(&self, tenants: Tenants) {
        *crate::sync::write(&self.tenants) = tenants;
    }

    /// The windows of `tenant` with a limit now, and their limits.
    fn windows(&self, tenant: &str, now: Timestamp) -> Vec<(Window, u64)> {
        let q = crate::sync::read(&self.tenants).of(tenant).0;
        let (day, month) = periods(now);
        [
            ("tokens_per_day", q.tokens_per_day, day),
            ("tokens_per_month", q.tokens_per_month, month),
        ]
        .into_iter()
        .filter_map(|(key, limit, period)| {
            limit.map(|l| {
                let w = Window {
                    tenant: tenant.to_string(),
                    key,
                    period,
                };
                (w, l)
            })
        })
        .collect()
    }

    /// Holds `tokens` against every window of `tenant`, or none when one would pass its limit.
    pub fn reserve(&self, tenant: &str, tokens: u64) -> Result<Reservation, Exhausted> {
        let now = Timestamp::now();
        let windows = self.windows(tenant, now);
        let mut accounts = crate::sync::lock(&self.accounts);
        for (w, limit) in &windows {
            let a = self.account(&mut accounts, w);
            if a.used + a.reserved + tokens > *limit {
                return Err(exhausted(w, *limit, now));
            }
        }
        for (w, _) in &windows {
            accounts.entry(w.clone()).or_default().reserved += tokens;
        }
        Ok(Reservation {
            windows: windows.into_iter().map(|(w, _)| w).collect(),
            tokens,
        })
    }

    /// A call ended having taken `used` tokens (0 if it failed).
    pub fn settle(&self, r: Reservation, used: u64) {
        let mut accounts = crate::sync::lock(&self.accounts);
        for w in r.windows {
            let a = accounts.entry(w).or_default();
            a.reserved = a.reserved.saturating_sub(r.tokens);
            a.used += used;
        }
    }

    /// Whether a window of `tenant` is used up now (an inject to its LLM listeners waits).
    pub fn exhausted(&self, tenant: &str) -> Option<Exhausted> {
        let now = Timestamp::now();
        let windows = self.windows(tenant, now);
        let mut accounts = crate::sync::lock(&self.accounts);
        windows.into_iter().find_map(|(w, limit)| {
            let a = self.account(&mut accounts, &w);
            (a.used >= limit).then(|| exhausted(&w, limit, now))
        })
    }

    /// Holds `tokens` against `listener`'s budget in `thread` (`limit` tokens), or says why
    /// not.
    pub fn reserve_thread(
        &self,
        listener: &str,
        thread: &str,
        limit: u64,
        tokens: u64,
    ) -> Result<ThreadHold, String> {
        let key = (listener.to_string(), thread.to_string());
        let mut threads = crate::sync::lock(&self.threads);
        if !threads.contains_key(&key) {
            if threads.len() >= MAX_THREAD_ACCOUNTS {
                let idle = threads
                    .iter()
                    .find(|(_, a)| a.reserved == 0)
                    .map(|(k, _)| k.clone());
                if let Some(k) = idle {
                    threads.remove(&k);
                }
            }
            let used = self
                .source
                .as_ref()
                .map_or(0, |s| s.used_in_thread(listener, thread));
            threads.insert(key.clone(), Account { used, reserved: 0 });
        }
        let a = threads.entry(key.clone()).or_default();
        if a.used + a.reserved + tokens > limit {
            return Err(format!(
                "budget: `{listener}`'s budget.tokens_per_thread ({limit} tokens) reached in \
                 this thread ({} used)",
                a.used
            ));
        }
        a.reserved += tokens;
        Ok(ThreadHold { key, tokens })
    }

    /// A call held against a thread's budget ended having taken `used` tokens.
    pub fn settle_thread(&self, hold: ThreadHold, used: u64) {
        let mut threads = crate::sync::lock(&self.threads);
        let a = threads.entry(hold.key).or_default();
        a.reserved = a.reserved.saturating_sub(hold.tokens);
        a.used += used;
    }

    /// Where each window of `tenant` with a limit stands now.
    pub fn state(&self, tenant: &str) -> Vec<WindowState> {
        let now = Timestamp::now();
        let windows = self.windows(tenant, now);
        let mut accounts = crate::sync::lock(&self.accounts);
        windows
            .into_iter()
            .map(|(w, limit)| {
                let a = self.account(&mut accounts, &w);
                let e = exhausted(&w, limit, now);
                WindowState {
                    tenant: w.tenant,
                    key: w.key,
                    period: w.period,
                    limit,
                    used: a.used,
                    reserved: a.reserved,
                    remaining: limit.saturating_sub(a.used + a.reserved),
                    resets_at: e.resets_at,
                }
            })
            .collect()
    }

    /// A window's account, its use read from the usage account when first asked for (an
    /// earlier window of the same key is forgotten then).
    fn account(&self, accounts: &mut HashMap<Window, Account>, w: &Window) -> Account {
        if let Some(a) = accounts.get(w) {
            return *a;
        }
        accounts.retain(|k, _| !(k.tenant == w.tenant && k.key == w.key));
        let (from, to) = match w.key {
            "tokens_per_day" => (w.period.clone(), w.period.clone()),
            _ => (format!("{}-01", w.period), format!("{}-31", w.period)),
        };
        let used = self
            .source
            .as_ref()
            .map_or(0, |s| s.used(&w.tenant, &from, &to));
        let a = Account { used, reserved: 0 };
        accounts.insert(w.clone(), a);
        a
    }
}

/// Today (`YYYY-MM-DD`) and this month (`YYYY-MM`), UTC.
fn periods(now: Timestamp) -> (String, String) {
    let t = utc(now);
    (
        format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()),
        format!("{:04}-{:02}", t.year(), u8::from(t.month())),
    )
}

fn utc(now: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(now.0) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn exhausted(w: &Window, limit: u64, now: Timestamp) -> Exhausted {
    let t = utc(now);
    let start = t.date().midnight().assume_utc();
    let end = match w.key {
        "tokens_per_day" => start + time::Duration::days(1),
        _ => {
            let (y, m) = match t.month() {
                time::Month::December => (t.year() + 1, time::Month::January),
                m => (t.year(), m.next()),
            };
            time::Date::from_calendar_date(y, m, 1)
                .map(|d| d.midnight().assume_utc())
                .unwrap_or(start)
        }
    };
    let resets_at = end
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    Exhausted {
        tenant: w.tenant.clone(),
        key: w.key,
        limit,
        resets_at,
        retry_after: u64::try_from((end - t).whole_seconds()).unwrap_or(0).max(1),
    }
}
