//! Hashes: SHA-256 as lower-case hex (API keys' secrets, uploaded scripts), and the hash
//! maps of the hot path.
//!
//! The maps: std's default hasher (SipHash) costs about 240 instructions
//! for a 36-byte thread id; these maps hash with foldhash, seeded per map, so keys a client
//! can choose (thread ids, listener names in an inject) cannot be made to collide up front.

/// The per-map seeded hasher.
pub(crate) type SeededState = foldhash::fast::RandomState;
/// A `HashMap` hashed by [`SeededState`].
pub(crate) type SeededMap<K, V> = std::collections::HashMap<K, V, SeededState>;
/// A `HashSet` hashed by [`SeededState`].
pub(crate) type SeededSet<K> = std::collections::HashSet<K, SeededState>;

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// SHA-256 of `bytes`, as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    to_hex(&sha2::Sha256::digest(bytes))
}
