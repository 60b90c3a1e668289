//! Hash maps for the hot path. std's default hasher (SipHash) costs about 240 instructions
//! for a 36-byte thread id; these maps hash with foldhash, seeded per map, so keys a client
//! can choose (thread ids, listener names in an inject) cannot be made to collide up front.

/// The per-map seeded hasher.
pub(crate) type SeededState = foldhash::fast::RandomState;
/// A `HashMap` hashed by [`SeededState`].
pub(crate) type SeededMap<K, V> = std::collections::HashMap<K, V, SeededState>;
/// A `HashSet` hashed by [`SeededState`].
pub(crate) type SeededSet<K> = std::collections::HashSet<K, SeededState>;
