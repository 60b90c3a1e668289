//! The checks of the organism-wide sections that loading runs: `auth`,
//! `external_callbacks` and `organism.nats`, with the defaults they fill in. Each problem
//! is collected, none stops the others.

use super::*;

/// `auth:`: the methods, and what each needs (`jwt`: exactly one of `secret_env`, set, or
/// `jwks_file`).
pub(super) fn check_auth(a: AuthSection, base: &Path, c: &mut Collector) -> AuthConfig {
    let mut methods = Vec::new();
    for m in a.methods {
        if !methods.contains(&m) {
            methods.push(m);
        }
    }
    let uses_jwt = methods.contains(&AuthMethod::Jwt);
    match (&a.jwt, uses_jwt) {
        (None, true) => c.push(
            None,
            Some("auth.jwt"),
            "missing: `jwt` is in auth.methods, so say how tokens are verified (`secret_env` or `jwks_file`)",
        ),
        (Some(_), false) => c.push(
            None,
            Some("auth.jwt"),
            "is set, but `jwt` is not in auth.methods",
        ),
        (Some(j), true) => match (&j.secret_env, &j.jwks_file) {
            (Some(var), None) => {
                env_secret(var, None, "auth.jwt.secret_env", "the HS256 secret", c);
            }
            (None, Some(_)) => {}
            _ => c.push(
                None,
                Some("auth.jwt"),
                "give exactly one of `secret_env` (HS256) and `jwks_file` (RS256, EdDSA)",
            ),
        },
        (None, false) => {}
    }
    let jwt = a.jwt.map(|mut j| {
        j.jwks_file = j.jwks_file.map(|f| base.join(f));
        j
    });
    for (key, value) in [
        ("auth.inject_per_s", a.inject_per_s),
        ("auth.burst", a.burst),
        ("auth.failed_auth_per_minute", a.failed_auth_per_minute),
    ] {
        if value == Some(0) {
            c.push(
                None,
                Some(key),
                "must be at least 1 (leave it out for no limit)",
            );
        }
    }
    if a.burst.is_some() && a.inject_per_s.is_none() {
        c.push(None, Some("auth.burst"), "needs auth.inject_per_s");
    }
    AuthConfig {
        methods,
        public_metrics: a.public_metrics,
        keys_file: a.keys_file.map(|f| base.join(f)),
        jwt,
        inject_per_s: a.inject_per_s,
        burst: a.burst,
        failed_auth_per_minute: a.failed_auth_per_minute,
    }
}

/// With authentication on, every external listener needs `token_env`: its callbacks carry
/// the agent's token, not an API credential, so without one anybody could answer for it.
pub(super) fn check_external_callbacks(
    auth: &AuthConfig,
    listeners: &[ListenerConfig],
    c: &mut Collector,
) {
    if !auth.enabled() {
        return;
    }
    for l in listeners {
        if l.external.as_ref().is_some_and(|e| e.token.is_none()) {
            c.push(
                Some(l.name.as_str()),
                Some("token_env"),
                "missing: with auth.methods set, an external listener's callbacks must carry its token",
            );
        }
    }
}

/// Default `organism.nats.ack_wait_ms`.
pub const DEFAULT_NATS_ACK_WAIT_MS: u64 = 5_000;
/// Default `organism.nats.deliver_timeout_ms`.
pub const DEFAULT_NATS_DELIVER_TIMEOUT_MS: u64 = 60_000;
/// Default `organism.nats.max_deliver`.
pub const DEFAULT_NATS_MAX_DELIVER: u32 = 5;
/// Default `organism.nats.events_max_bytes` (1 GiB).
pub const DEFAULT_EVENTS_MAX_BYTES: u64 = 1 << 30;
/// Default `organism.nats.events_max_age` (7 days).
pub const DEFAULT_EVENTS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);

/// `organism.nats`, checked: a `nats://` URL, a prefix fit for stream names, its credential
/// read from the environment; and that every placed listener has it.
pub(super) fn check_nats(
    section: Option<NatsSection>,
    organism_name: &str,
    listeners: &[ListenerConfig],
    c: &mut Collector,
) -> Option<NatsConfig> {
    let placed: Vec<&str> = listeners
        .iter()
        .filter(|l| l.placement == Placement::Workers)
        .map(|l| l.name.as_str())
        .collect();
    let Some(s) = section else {
        for name in placed {
            c.push(
                Some(name),
                Some("placement"),
                "`placement: workers` needs `organism.nats` (the NATS server workers reach \
                 the pump through)",
            );
        }
        return None;
    };
    check_nats_urls(&s.url, c);
    let prefix = s
        .stream_prefix
        .unwrap_or_else(|| NatsConfig::default_prefix(organism_name));
    if prefix.is_empty()
        || prefix.len() > 64
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        c.push(
            None,
            Some("organism.nats.stream_prefix"),
            "must be 1-64 letters, digits, `_` or `-` (it begins stream names and subjects)",
        );
    }
    let credentials = s.credentials_env.as_deref().and_then(|var| {
        env_secret(
            var,
            None,
            "organism.nats.credentials_env",
            "the NATS credential: user:password or a token",
            c,
        )
    });
    let ms = |key: &str, v: Option<u64>, default: u64, c: &mut Collector| {
        let v = v.unwrap_or(default);
        if v == 0 {
            c.push(None, Some(key), "must be at least 1");
        }
        std::time::Duration::from_millis(v.max(1))
    };
    let ack_wait = ms(
        "organism.nats.ack_wait_ms",
        s.ack_wait_ms,
        DEFAULT_NATS_ACK_WAIT_MS,
        c,
    );
    let deliver_timeout = ms(
        "organism.nats.deliver_timeout_ms",
        s.deliver_timeout_ms,
        DEFAULT_NATS_DELIVER_TIMEOUT_MS,
        c,
    );
    let max_deliver = s.max_deliver.unwrap_or(DEFAULT_NATS_MAX_DELIVER);
    if max_deliver == 0 {
        c.push(
            None,
            Some("organism.nats.max_deliver"),
            "must be at least 1",
        );
    }
    let events_max_age = match s.events_max_age.as_deref() {
        None => DEFAULT_EVENTS_MAX_AGE,
        Some(text) => super::parse_age(text).unwrap_or_else(|| {
            c.push(
                None,
                Some("organism.nats.events_max_age"),
                format!("`{text}` is not a duration like 7d, 12h or 30m"),
            );
            DEFAULT_EVENTS_MAX_AGE
        }),
    };
    let events_max_bytes = s.events_max_bytes.unwrap_or(DEFAULT_EVENTS_MAX_BYTES);
    if events_max_bytes < 1 << 20 {
        c.push(
            None,
            Some("organism.nats.events_max_bytes"),
            "must be at least 1048576 (1 MiB)",
        );
    }
    Some(NatsConfig {
        mirror_events: s.mirror_events.unwrap_or(true),
        mirror_deltas: s.mirror_deltas.unwrap_or(false),
        events_max_bytes,
        events_max_age,
        url: s.url,
        stream_prefix: prefix,
        credentials_env: s.credentials_env,
        credentials,
        ack_wait,
        deliver_timeout,
        max_deliver: max_deliver.max(1),
    })
}

/// `organism.nats.url`: one or more `nats://` (or `tls://`) URLs, comma-separated, none
/// holding a credential (that goes in `credentials_env`).
fn check_nats_urls(urls: &str, c: &mut Collector) {
    let key = Some("organism.nats.url");
    if urls.trim().is_empty() {
        c.push(
            None,
            key,
            "must not be empty: a URL like nats://127.0.0.1:4222",
        );
    }
    for url in urls.split(',') {
        match reqwest::Url::parse(url.trim()) {
            Ok(u) if matches!(u.scheme(), "nats" | "tls") && u.has_host() => {
                if u.password().is_some() || !u.username().is_empty() {
                    c.push(
                        None,
                        key,
                        "holds a credential; name an environment variable in \
                         `credentials_env` instead",
                    );
                }
            }
            _ => c.push(
                None,
                key,
                format!("`{}` is not a URL like nats://127.0.0.1:4222", url.trim()),
            ),
        }
    }
}

/// The value of the environment variable `var` that a file names for a secret, or `None`
/// and a problem at `key` (of `listener`) saying it is not set and what it holds.
pub(super) fn env_secret(
    var: &str,
    listener: Option<&str>,
    key: &str,
    holds: &str,
    c: &mut Collector,
) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            c.push(
                listener,
                Some(key),
                format!("environment variable `{var}` is not set (it holds {holds})"),
            );
            None
        }
    }
}
