//! Who a client is and what it may see, whatever door it came through: the [`Principal`] a
//! credential stands for (API keys, JWTs, revocation), its [`Scope`] among the organism's
//! listeners, key creation, the rate limits on credentials and the audit log. The HTTP
//! edges (`api::auth` for the API and the gateway) read credentials from requests and
//! answer refusals; the CLI's `keys` uses this module directly.
//!
//! A refused credential is refused the same whatever the reason; the reason
//! ([`Refused::Invalid`]) is for the log, never for the client.

pub mod audit;
pub mod jwt;
pub mod key;
pub mod keys;
pub mod limits;

use std::sync::{Arc, Mutex};

pub use crate::config::Role;
use crate::config::{AuthMethod, OrganismConfig};
use crate::store::keys::KeyRow;
use crate::time::Timestamp;
pub use key::{new_key, new_key_with_rate, KeyRate, NewKeyError};
pub use keys::KeySource;
pub use limits::Throttled;

/// The longest credential read; a longer one is refused unread.
pub const MAX_CREDENTIAL_BYTES: usize = 4096;

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `key:NAME` for an API key, the token's `sub` for a JWT; `None` for the implicit
    /// admin of an organism without authentication.
    pub name: Option<String>,
    pub role: Role,
    /// The tenant it acts for; `None` for the whole organism.
    pub tenant: Option<String>,
    /// The key it came from, which a revocation ends.
    pub key_id: Option<String>,
    /// When its credential stops being valid.
    pub expires: Option<Timestamp>,
    /// Its own inject rate and burst (a key's), over `auth.inject_per_s`.
    pub inject_rate: Option<(u32, Option<u32>)>,
}

impl Principal {
    /// The principal of an organism without authentication.
    pub fn implicit() -> Principal {
        Principal {
            name: None,
            role: Role::Admin,
            tenant: None,
            key_id: None,
            expires: None,
            inject_rate: None,
        }
    }

    /// Whether its credential can stop holding while a stream it opened lasts (a key can be
    /// revoked, a token expires): such a stream looks at it again.
    pub fn can_lapse(&self) -> bool {
        self.key_id.is_some() || self.expires.is_some()
    }

    /// The identity its injects carry: its name, or `default` (`api`, `ws`) without one.
    pub fn identity<'a>(&'a self, default: &'a str) -> &'a str {
        self.name.as_deref().unwrap_or(default)
    }

    /// Whether it may do what `need` asks.
    pub fn may(&self, need: Role) -> bool {
        self.role >= need
    }

    /// What it may see of the organism `config` describes now.
    pub fn scope(&self, config: &OrganismConfig) -> Scope {
        self.scope_in(
            config
                .listeners
                .iter()
                .map(|l| (l.name.as_str(), l.tenant.as_deref())),
        )
    }

    /// What it sees among `listeners` (each name with its tenant): the one rule
    /// [`Principal::scope`] and a gateway (from the mirrored snapshot) both follow.
    pub fn scope_in<'a>(
        &self,
        listeners: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Scope {
        Scope(self.tenant.as_ref().map(|t| {
            listeners
                .into_iter()
                .filter(|(_, tenant)| *tenant == Some(t.as_str()))
                .map(|(name, _)| name.to_string())
                .collect()
        }))
    }
}

/// What a principal may see: every listener, or its tenant's. Visibility is a filter pushed
/// down into the queries (`within`) and the streams, so items and totals agree, and what is
/// not visible answers exactly as what does not exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope(Option<Vec<String>>);

impl Scope {
    /// Sees everything (a credential without a tenant).
    pub fn everything(&self) -> bool {
        self.0.is_none()
    }

    /// Whether it sees the listener (or injector identity) `agent`.
    pub fn sees(&self, agent: &str) -> bool {
        self.0
            .as_ref()
            .is_none_or(|set| set.iter().any(|a| a == agent))
    }

    /// Whether it sees a message from `from` to `to`.
    pub fn sees_message(&self, from: &str, to: Option<&str>) -> bool {
        self.everything() || self.sees(from) || to.is_some_and(|t| self.sees(t))
    }

    /// Whether it sees a thread with these participants.
    pub fn sees_thread(&self, participants: &[String]) -> bool {
        self.everything() || participants.iter().any(|p| self.sees(p))
    }

    /// The `within` of the history's filters.
    pub fn within(&self) -> Option<Vec<String>> {
        self.0.clone()
    }
}

/// Why a credential was refused: for the log, never for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No credential was presented.
    Missing,
    /// One was, and it is not good; the reason is for the log.
    Invalid(String),
}

/// Checks credentials against the methods the organism allows.
pub struct Authenticator {
    keys: Option<KeySource>,
    jwt: Option<jwt::JwtVerifier>,
    pub public_metrics: bool,
    /// When each key was last used, written to the store every few seconds.
    used: Mutex<crate::hash::SeededMap<String, Timestamp>>,
    /// Woken by every revocation made through the API, so open sessions look again at once.
    pub(crate) revoked: tokio::sync::Notify,
    pub limits: limits::Limits,
    pub audit: audit::AuditLog,
}

impl Authenticator {
    /// The organism's authenticator; `None` without `auth.methods`.
    pub fn new(config: &OrganismConfig) -> Result<Option<Authenticator>, String> {
        let auth = &config.auth;
        if !auth.enabled() {
            return Ok(None);
        }
        let keys = if auth.uses(AuthMethod::Keys) {
            Some(KeySource::of(config)?)
        } else {
            None
        };
        let jwt = match (&auth.jwt, auth.uses(AuthMethod::Jwt)) {
            (Some(c), true) => Some(jwt::JwtVerifier::new(c)?),
            _ => None,
        };
        Ok(Some(Authenticator {
            keys,
            jwt,
            public_metrics: auth.public_metrics,
            used: Mutex::default(),
            revoked: tokio::sync::Notify::new(),
            limits: limits::Limits::new(auth),
            audit: audit::AuditLog::of(config)?,
        }))
    }

    pub fn keys(&self) -> Option<&KeySource> {
        self.keys.as_ref()
    }

    /// The principal `token` stands for.
    pub fn verify(&self, token: &str) -> Result<Principal, Refused> {
        if token.len() > MAX_CREDENTIAL_BYTES {
            return Err(Refused::Invalid(format!(
                "credential of {} bytes (at most {MAX_CREDENTIAL_BYTES})",
                token.len()
            )));
        }
        if !token.starts_with(key::PREFIX) {
            return match &self.jwt {
                Some(jwt) if jwt::JwtVerifier::looks_like(token) => jwt.verify(token),
                _ => Err(Refused::Invalid("neither an API key nor a JWT".into())),
            };
        }
        let Some(keys) = &self.keys else {
            return Err(Refused::Invalid("an API key, and keys are off".into()));
        };
        let Some(presented) = key::parse(token) else {
            return Err(Refused::Invalid("not an API key (ask_…)".into()));
        };
        let row = keys
            .find(presented.id)
            .map_err(|e| Refused::Invalid(format!("keys unreadable: {e}")))?
            .ok_or_else(|| Refused::Invalid(format!("no key with id {}", presented.id)))?;
        if !key::matches(presented.secret, &row.hash) {
            return Err(Refused::Invalid(format!(
                "wrong secret for key `{}`",
                row.name
            )));
        }
        let principal = principal_of(&row)?;
        let now = Timestamp::now();
        let mut used = crate::sync::lock(&self.used);
        match used.get_mut(&row.id) {
            Some(t) => *t = now,
            None => drop(used.insert(row.id.clone(), now)),
        }
        Ok(principal)
    }

    /// [`Authenticator::still_valid`] for async code: looked up off the async workers.
    pub async fn still_holds(self: &Arc<Self>, p: &Principal) -> bool {
        let (auth, p) = (self.clone(), p.clone());
        tokio::task::spawn_blocking(move || auth.still_valid(&p))
            .await
            .unwrap_or(false)
    }

    /// Whether `p`'s credential still holds (not revoked, not expired).
    pub fn still_valid(&self, p: &Principal) -> bool {
        if p.expires.is_some_and(|e| e <= Timestamp::now()) {
            return false;
        }
        match (&p.key_id, &self.keys) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(id), Some(keys)) => matches!(
                keys.find(id).map(|r| r.map(|r| principal_of(&r).is_ok())),
                Ok(Some(true))
            ),
        }
    }

    /// Writes when keys were last used (called every few seconds).
    pub fn flush_used(&self) {
        let used: Vec<(String, Timestamp)> = crate::sync::lock(&self.used).drain().collect();
        if let (false, Some(keys)) = (used.is_empty(), &self.keys) {
            if let Err(e) = keys.touch(&used) {
                tracing::warn!("cannot record when API keys were last used: {e}");
            }
        }
    }
}

/// The principal a kept key stands for, if it is live.
fn principal_of(row: &KeyRow) -> Result<Principal, Refused> {
    if row.revoked.is_some() {
        return Err(Refused::Invalid(format!("key `{}` was revoked", row.name)));
    }
    if row.expires.is_some_and(|e| e <= Timestamp::now()) {
        return Err(Refused::Invalid(format!("key `{}` expired", row.name)));
    }
    Ok(Principal {
        name: Some(format!("key:{}", row.name)),
        role: row.role,
        tenant: row.tenant.clone(),
        key_id: Some(row.id.clone()),
        expires: row.expires,
        inject_rate: row.inject_per_s.map(|r| (r, row.burst)),
    })
}
