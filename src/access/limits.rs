//! Rate limits on credentials, by `governor` (GCRA): injects per principal
//! (`auth.inject_per_s`, `auth.burst`), and failed authentications per remote address
//! (`auth.failed_auth_per_minute`, default 20). Over a limit, the answer is [`Throttled`]
//! (the API's 429 with `Retry-After`). Each limiter keeps state per key only while it differs from a fresh one
//! (`tidy`, every few seconds).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::AuthConfig;

/// Over a limit: what was limited, and how long until one more would pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    pub what: String,
    pub wait: Duration,
}

impl std::fmt::Display for Throttled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.wait;
        let secs = w.as_secs() + u64::from(w.subsec_nanos() > 0);
        write!(f, "{}; retry after {secs} s", self.what)
    }
}

/// Failed authentications a remote address may make per minute when the file says nothing.
pub const DEFAULT_FAILED_AUTH_PER_MINUTE: u32 = 20;

/// A key's own rate, and its limiter.
type OwnRate = ((u32, Option<u32>), DefaultDirectRateLimiter);

pub struct Limits {
    failed: DefaultKeyedRateLimiter<IpAddr>,
    inject: Option<DefaultKeyedRateLimiter<String>>,
    /// Keys with a rate of their own: one limiter each, by key id, with the rate it was made
    /// for.
    own: std::sync::Mutex<std::collections::HashMap<String, OwnRate>>,
    /// Tenants with a rate (`tenants.<t>.inject_per_s`), shared by all their credentials.
    tenants: std::sync::Mutex<std::collections::HashMap<String, OwnRate>>,
}

impl Limits {
    pub fn new(c: &AuthConfig) -> Limits {
        let per_minute = NonZeroU32::new(
            c.failed_auth_per_minute
                .unwrap_or(DEFAULT_FAILED_AUTH_PER_MINUTE),
        )
        .unwrap_or(NonZeroU32::MIN);
        let inject = c.inject_per_s.and_then(NonZeroU32::new).map(|rate| {
            let burst = c.burst.and_then(NonZeroU32::new).unwrap_or(rate);
            RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
        });
        Limits {
            failed: RateLimiter::keyed(Quota::per_minute(per_minute)),
            inject,
            own: Default::default(),
            tenants: Default::default(),
        }
    }

    /// Counts one failed authentication from `ip`; `Err` once it is over its limit.
    pub fn failed_auth(&self, ip: IpAddr) -> Result<(), Throttled> {
        self.failed.check_key(&ip).map_err(|n| {
            too_many(
                "too many failed authentications from this address",
                n.wait_time_from(DefaultClock::default().now()),
            )
        })
    }

    /// Counts one inject by `p`; `Err` once it is over its tenant's rate (`tenant_rate`,
    /// from `tenants.<t>.inject_per_s`, all the tenant's credentials together), its key's
    /// own rate, or else `auth.inject_per_s`.
    pub fn inject(&self, p: &super::Principal, tenant_rate: Option<u32>) -> Result<(), Throttled> {
        if let (Some(rate), Some(tenant)) = (tenant_rate, &p.tenant) {
            let mut tenants = crate::sync::lock(&self.tenants);
            let rate = (rate, None);
            let entry = tenants
                .entry(tenant.clone())
                .or_insert_with(|| (rate, direct(rate)));
            if entry.0 != rate {
                *entry = (rate, direct(rate));
            }
            entry.1.check().map_err(|n| {
                too_many(
                    &format!(
                        "too many injects by tenant `{tenant}` (its inject_per_s is {})",
                        rate.0
                    ),
                    n.wait_time_from(DefaultClock::default().now()),
                )
            })?;
        }
        let over = |n: governor::NotUntil<_>| {
            too_many(
                "too many injects by this credential (auth.inject_per_s, or the key's own)",
                n.wait_time_from(DefaultClock::default().now()),
            )
        };
        if let (Some(rate), Some(id)) = (p.inject_rate, &p.key_id) {
            let mut own = crate::sync::lock(&self.own);
            let entry = own
                .entry(id.clone())
                .or_insert_with(|| (rate, direct(rate)));
            if entry.0 != rate {
                *entry = (rate, direct(rate));
            }
            return entry.1.check().map_err(over);
        }
        let (Some(limiter), Some(name)) = (&self.inject, &p.name) else {
            return Ok(());
        };
        limiter.check_key(name).map_err(over)
    }

    /// Forgets keys whose state is that of a fresh one.
    pub fn tidy(&self) {
        self.failed.retain_recent();
        if let Some(l) = &self.inject {
            l.retain_recent();
        }
    }
}

/// A limiter of `rate` per second with `burst` (default: the rate).
fn direct((rate, burst): (u32, Option<u32>)) -> DefaultDirectRateLimiter {
    let rate = NonZeroU32::new(rate).unwrap_or(NonZeroU32::MIN);
    let burst = burst.and_then(NonZeroU32::new).unwrap_or(rate);
    RateLimiter::direct(Quota::per_second(rate).allow_burst(burst))
}

fn too_many(what: &str, wait: Duration) -> Throttled {
    Throttled {
        what: what.to_string(),
        wait,
    }
}
