//! What an API key is: `ask_<id>_<secret>`, a 48-bit public id (how the key is found) and a
//! 256-bit secret from the operating system's random source, both hex. Only the SHA-256 of
//! the secret is kept; a presented key is checked by comparing hashes in constant time.

use subtle::ConstantTimeEq;

use crate::config::Role;
use crate::store::keys::KeyRow;
use crate::time::Timestamp;

/// Every key starts with this.
pub const PREFIX: &str = "ask_";
const ID_BYTES: usize = 6;
const SECRET_BYTES: usize = 32;

/// A key's public id and secret, as presented.
#[derive(Debug, PartialEq, Eq)]
pub struct Presented<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

/// Splits a presented key; `None` for anything not shaped as a key.
pub fn parse(token: &str) -> Option<Presented<'_>> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex =
        |s: &str, bytes: usize| s.len() == 2 * bytes && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, ID_BYTES) && hex(secret, SECRET_BYTES)).then_some(Presented { id, secret })
}

use crate::hash::to_hex;

/// The hash kept for `secret`.
pub fn hash(secret: &str) -> String {
    crate::hash::sha256_hex(secret.to_ascii_lowercase().as_bytes())
}

/// Whether `secret` is the one `kept` is the hash of, compared in constant time. (As
/// [`hash`], without allocating: this is on every request.)
pub fn matches(secret: &str, kept: &str) -> bool {
    use sha2::Digest;
    let mut lower = [0u8; 2 * SECRET_BYTES];
    let Some(lower) = lower.get_mut(..secret.len()) else {
        return false;
    };
    lower.copy_from_slice(secret.as_bytes());
    lower.make_ascii_lowercase();
    let mut hex = [0u8; 64];
    crate::hash::hex_into(&sha2::Sha256::digest(lower), &mut hex);
    hex.ct_eq(kept.as_bytes()).into()
}

/// A new key: `(the key to show once, its id, the hash to keep)`.
pub fn generate() -> Result<(String, String, String), String> {
    let mut id = [0u8; ID_BYTES];
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut id)
        .and_then(|()| getrandom::fill(&mut secret))
        .map_err(|e| format!("the system's random source failed: {e}"))?;
    let (id, secret) = (to_hex(&id), to_hex(&secret));
    let hash = hash(&secret);
    Ok((format!("{PREFIX}{id}_{secret}"), id, hash))
}

/// A key's own inject rate: `(per second, burst)`, each at least 1, burst only with a rate.
pub type KeyRate = (Option<u32>, Option<u32>);

/// Why a key was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NewKeyError {
    /// A field the caller gave is not acceptable: which one, and why.
    #[error("{field}: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
    /// The system's random source failed.
    #[error("{0}")]
    Random(String),
}

fn bad(field: &'static str, message: impl Into<String>) -> NewKeyError {
    NewKeyError::Field {
        field,
        message: message.into(),
    }
}

/// Checks a key's name, tenant and lifetime, and makes the row and the key to show once.
pub fn new_key(
    name: &str,
    role: Role,
    tenant: Option<&str>,
    expires: Option<&str>,
) -> Result<(String, KeyRow), NewKeyError> {
    new_key_with_rate(name, role, tenant, expires, (None, None))
}

/// [`new_key`], with the key's own inject rate.
pub fn new_key_with_rate(
    name: &str,
    role: Role,
    tenant: Option<&str>,
    expires: Option<&str>,
    (inject_per_s, burst): KeyRate,
) -> Result<(String, KeyRow), NewKeyError> {
    if inject_per_s == Some(0) || burst == Some(0) || (burst.is_some() && inject_per_s.is_none()) {
        return Err(bad(
            if inject_per_s == Some(0) || inject_per_s.is_none() {
                "inject_per_s"
            } else {
                "burst"
            },
            "inject_per_s and burst are at least 1, and burst needs inject_per_s",
        ));
    }
    let ok_name = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    if !ok_name(name) {
        return Err(bad(
            "name",
            "a key's name is 1-64 letters, digits, `.`, `_` or `-`",
        ));
    }
    if tenant.is_some_and(|t| !crate::config::valid_tenant(t)) {
        return Err(bad(
            "tenant",
            "a tenant is 1-64 letters, digits, `.`, `_` or `-`",
        ));
    }
    let now = Timestamp::now();
    let expires = match expires {
        None => None,
        Some(e) => {
            let d = crate::config::parse_age(e)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    bad(
                        "expires",
                        format!(
                            "`{}` is not a lifetime such as 30d, 12h or 15m",
                            crate::clip::clip(e.to_string(), 64)
                        ),
                    )
                })?;
            Some(Timestamp(now.0.saturating_add(d.as_millis() as u64)))
        }
    };
    let (key, id, hash) = generate().map_err(NewKeyError::Random)?;
    Ok((
        key,
        KeyRow {
            id,
            name: name.to_string(),
            hash,
            role,
            tenant: tenant.map(str::to_string),
            created: now,
            expires,
            last_used: None,
            revoked: None,
            inject_per_s,
            burst,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_parses_and_matches_only_its_own_hash() {
        let (key, id, kept) = generate().unwrap();
        let p = parse(&key).unwrap();
        assert_eq!(p.id, id);
        assert!(matches(p.secret, &kept));
        let (other, _, other_kept) = generate().unwrap();
        assert_ne!(key, other);
        assert!(!matches(p.secret, &other_kept));
        // Hex in either case is the same secret, as `hash` keeps it.
        assert!(matches(&p.secret.to_ascii_uppercase(), &kept));
        assert_eq!(hash(&p.secret.to_ascii_uppercase()), kept);
        // Longer than a secret: refused, not cut.
        assert!(!matches(&format!("{}0", p.secret), &kept));
        assert_eq!(key.len(), PREFIX.len() + 12 + 1 + 64);
    }

    #[test]
    fn anything_not_shaped_as_a_key_is_refused() {
        for bad in [
            "",
            "ask_",
            "ask_abc_def",
            "xsk_0123456789ab_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "ask_0123456789ab_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg",
            "ask_0123456789ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
