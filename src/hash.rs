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
    let mut hex = vec![0u8; 2 * bytes.len()];
    hex_into(bytes, &mut hex);
    String::from_utf8(hex).unwrap_or_default()
}

/// Lower-case hex of `bytes` into `out` (as much as fits: two digits a byte).
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// SHA-256 of `bytes`, as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    to_hex(&sha2::Sha256::digest(bytes))
}
