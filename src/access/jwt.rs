//! JSON Web Tokens (`auth.methods: [jwt]`), verified with the `jsonwebtoken` crate: HS256
//! with a secret from the environment (`auth.jwt.secret_env`), or RS256/EdDSA with the public
//! keys of a JWKS file (`auth.jwt.jwks_file`, the key chosen by the token's `kid`, or the
//! only key). Each key verifies only its own algorithm, so `alg: none` and algorithm
//! confusion (an RSA public key used as an HMAC secret) are refused. `exp` is required; `nbf`
//! is checked; `iss` and `aud` are required, and checked, when configured. Claims: `sub` (the principal's name), `role`,
//! `tenant`.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::{Principal, Refused, Role};
use crate::config::JwtConfig;
use crate::time::Timestamp;

/// The longest JWKS file read.
const MAX_JWKS_BYTES: u64 = 1 << 20;

/// How far a token's times may be off the server's clock.
pub const LEEWAY_SECONDS: u64 = 30;

struct Key {
    kid: Option<String>,
    key: DecodingKey,
    algorithm: Algorithm,
}

/// The keys tokens are checked against.
pub struct JwtVerifier {
    keys: Vec<Key>,
    issuer: Option<String>,
    audience: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    role: Option<String>,
    tenant: Option<String>,
    exp: u64,
}

impl JwtVerifier {
    pub fn new(c: &JwtConfig) -> Result<JwtVerifier, String> {
        let keys = match (&c.secret_env, &c.jwks_file) {
            (Some(var), None) => {
                let secret = std::env::var(var)
                    .ok()
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| format!("auth.jwt.secret_env: `{var}` is not set"))?;
                vec![Key {
                    kid: None,
                    key: DecodingKey::from_secret(secret.as_bytes()),
                    algorithm: Algorithm::HS256,
                }]
            }
            (None, Some(file)) => jwks(file)?,
            _ => return Err("auth.jwt: give exactly one of secret_env and jwks_file".into()),
        };
        Ok(JwtVerifier {
            keys,
            issuer: c.issuer.clone(),
            audience: c.audience.clone(),
        })
    }

    /// Whether `token` looks like a JWT (three dot-separated parts).
    pub fn looks_like(token: &str) -> bool {
        token.split('.').count() == 3
    }

    /// The principal a token stands for.
    pub fn verify(&self, token: &str) -> Result<Principal, Refused> {
        let bad = |why: String| Refused::Invalid(why);
        let header = decode_header(token).map_err(|e| bad(format!("JWT header: {e}")))?;
        let key = match &header.kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
        .ok_or_else(|| bad(format!("JWT kid {:?} names no key", header.kid)))?;
        if header.alg != key.algorithm {
            return Err(bad(format!(
                "JWT alg {:?} where its key is {:?}",
                header.alg, key.algorithm
            )));
        }
        let mut v = Validation::new(key.algorithm);
        v.leeway = LEEWAY_SECONDS;
        v.validate_nbf = true;
        // `iss` and `aud` are required whenever they are configured: a token that leaves
        // one out is refused, as one with a wrong value is.
        let mut required = vec!["exp"];
        required.extend(self.audience.as_ref().map(|_| "aud"));
        required.extend(self.issuer.as_ref().map(|_| "iss"));
        v.set_required_spec_claims(&required);
        match &self.audience {
            Some(a) => v.set_audience(&[a]),
            None => v.validate_aud = false,
        }
        if let Some(i) = &self.issuer {
            v.set_issuer(&[i]);
        }
        let claims = decode::<Claims>(token, &key.key, &v)
            .map_err(|e| bad(format!("JWT: {e}")))?
            .claims;
        let sub = claims
            .sub
            .filter(|s| !s.is_empty() && s.len() <= 128)
            .ok_or_else(|| bad("JWT without a usable `sub`".into()))?;
        let role = claims
            .role
            .as_deref()
            .and_then(Role::parse)
            .ok_or_else(|| bad(format!("JWT of `{sub}` has no known `role`")))?;
        if claims
            .tenant
            .as_deref()
            .is_some_and(|t| !crate::config::valid_tenant(t))
        {
            return Err(bad(format!("JWT of `{sub}` has a malformed `tenant`")));
        }
        Ok(Principal {
            name: Some(sub),
            role,
            tenant: claims.tenant,
            key_id: None,
            expires: Some(Timestamp(claims.exp.saturating_mul(1000))),
            inject_rate: None,
        })
    }
}

/// The public keys of a JWKS file, each with the one algorithm it verifies.
fn jwks(path: &std::path::Path) -> Result<Vec<Key>, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("auth.jwt.jwks_file {shown}: {e}"))?;
    if meta.len() > MAX_JWKS_BYTES {
        return Err(format!(
            "auth.jwt.jwks_file {shown}: larger than {MAX_JWKS_BYTES} bytes"
        ));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("auth.jwt.jwks_file {shown}: {e}"))?;
    let set: JwkSet = serde_json::from_str(&text)
        .map_err(|e| format!("auth.jwt.jwks_file {shown}: not a JWKS: {e}"))?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
            (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
            (AlgorithmParameters::OctetKeyPair(p), None | Some(KeyAlgorithm::EdDSA))
                if p.curve == EllipticCurve::Ed25519 =>
            {
                Algorithm::EdDSA
            }
            _ => {
                return Err(format!(
                    "auth.jwt.jwks_file {shown}: key {i} is neither an RSA (RS256) nor an Ed25519 (EdDSA) public key"
                ))
            }
        };
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| format!("auth.jwt.jwks_file {shown}: key {i}: {e}"))?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            key,
            algorithm,
        });
    }
    if keys.is_empty() {
        return Err(format!("auth.jwt.jwks_file {shown}: no keys"));
    }
    Ok(keys)
}
