//! Rate limits on credentials, by `governor` (GCRA): injects per principal
//! (`auth.inject_per_s`, `auth.burst`), and failed authentications per remote address
//! (`auth.failed_auth_per_minute`, default 20). Over a limit, a request is answered 429 with
//! `Retry-After`. Each limiter keeps state per key only while it differs from a fresh one
//! (`tidy`, every few seconds).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::api::ApiError;
use crate::config::AuthConfig;

/// Failed authentications a remote address may make per minute when the file says nothing.
pub const DEFAULT_FAILED_AUTH_PER_MINUTE: u32 = 20;

pub struct Limits {
    failed: DefaultKeyedRateLimiter<IpAddr>,
    inject: Option<DefaultKeyedRateLimiter<String>>,
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
        }
    }

    /// Counts one failed authentication from `ip`; `Err` once it is over its limit.
    pub fn failed_auth(&self, ip: IpAddr) -> Result<(), ApiError> {
        self.failed.check_key(&ip).map_err(|n| {
            too_many(
                "too many failed authentications from this address",
                n.wait_time_from(DefaultClock::default().now()),
            )
        })
    }

    /// Counts one inject by `who`; `Err` once it is over `auth.inject_per_s`.
    pub fn inject(&self, who: &str) -> Result<(), ApiError> {
        let Some(limiter) = &self.inject else {
            return Ok(());
        };
        limiter.check_key(&who.to_string()).map_err(|n| {
            too_many(
                "too many injects by this credential (auth.inject_per_s)",
                n.wait_time_from(DefaultClock::default().now()),
            )
        })
    }

    /// Forgets keys whose state is that of a fresh one.
    pub fn tidy(&self) {
        self.failed.retain_recent();
        if let Some(l) = &self.inject {
            l.retain_recent();
        }
    }
}

fn too_many(what: &str, wait: Duration) -> ApiError {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("{what}; retry after {secs} s"),
    )
    .with_header(
        header::RETRY_AFTER,
        HeaderValue::from_str(&secs.max(1).to_string()).unwrap_or(HeaderValue::from_static("1")),
    )
}
