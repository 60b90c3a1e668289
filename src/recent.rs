//! The newest entries by key, within a count and a byte budget: a map that lets go of its
//! oldest entries once it holds more than either allows (the newest one always stays). What
//! is kept lately and looked up by id: decided inputs (`pump::inputs`), the message ids
//! clients chose (`pump::client_ids`), the labels of a gateway's threads
//! (`api::gateway::labels`).
//!
//! Every operation is constant time, amortized: a key placed again or removed leaves a stale
//! entry in the order, passed over when it comes to the front, and the stale entries are
//! dropped once they are as many as the live ones.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub struct Recent<V> {
    by_key: HashMap<Arc<str>, Entry<V>>,
    /// Keys in the order they were placed, each with its stamp then: an entry whose key has
    /// another stamp now (placed again, or removed) is stale.
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
    stamps: u64,
    max_len: usize,
    max_bytes: usize,
}

struct Entry<V> {
    value: V,
    weight: usize,
    stamp: u64,
}

impl<V> Recent<V> {
    /// At most `max_len` entries weighing `max_bytes` together (beyond, the oldest go).
    pub fn new(max_len: usize, max_bytes: usize) -> Self {
        Recent {
            by_key: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            stamps: 0,
            max_len: max_len.max(1),
            max_bytes,
        }
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.by_key.get(key).map(|e| &e.value)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// What the entries weigh together.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `value` under `key` as the newest entry, weighing `weight`; the value it
    /// replaces, if any.
    pub fn insert(&mut self, key: Arc<str>, value: V, weight: usize) -> Option<V> {
        let old = self.remove(&key);
        self.stamps += 1;
        let stamp = self.stamps;
        self.order.push_back((key.clone(), stamp));
        self.bytes += weight;
        self.by_key.insert(
            key,
            Entry {
                value,
                weight,
                stamp,
            },
        );
        self.trim();
        old
    }

    /// Keeps `value` under `key`: in the place of the key's entry if one is kept (it is not
    /// made the newest), else as the newest.
    pub fn replace(&mut self, key: Arc<str>, value: V, weight: usize) -> Option<V> {
        let Some(entry) = self.by_key.get_mut(&key) else {
            return self.insert(key, value, weight);
        };
        self.bytes = self.bytes - entry.weight + weight;
        entry.weight = weight;
        let old = std::mem::replace(&mut entry.value, value);
        self.trim();
        Some(old)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let entry = self.by_key.remove(key)?;
        self.bytes -= entry.weight;
        self.compact();
        Some(entry.value)
    }

    pub fn clear(&mut self) {
        self.by_key.clear();
        self.order.clear();
        self.bytes = 0;
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &V)> {
        self.order.iter().filter_map(|(key, stamp)| {
            self.by_key
                .get_key_value(key)
                .filter(|(_, e)| e.stamp == *stamp)
                .map(|(k, e)| (k, &e.value))
        })
    }

    /// Lets go of the oldest entries while there are too many or they weigh too much.
    fn trim(&mut self) {
        while self.by_key.len() > 1
            && (self.by_key.len() > self.max_len || self.bytes > self.max_bytes)
        {
            let Some((key, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.by_key.get(&key).is_some_and(|e| e.stamp == stamp) {
                if let Some(e) = self.by_key.remove(&key) {
                    self.bytes -= e.weight;
                }
            }
        }
        self.compact();
    }

    /// Drops the stale entries of the order once they are as many as the live ones.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.by_key.len().max(512) {
            let live = &self.by_key;
            self.order
                .retain(|(key, stamp)| live.get(key).is_some_and(|e| e.stamp == *stamp));
        }
    }
}

#[cfg(test)]
impl<V> Recent<V> {
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The order's entries, stale ones included.
    pub fn order_len(&self) -> usize {
        self.order.len()
    }

    /// What the entries' own weights add up to (the count [`Recent::bytes`] keeps).
    pub fn weights(&self) -> usize {
        self.by_key.values().map(|e| e.weight).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<V>(r: &Recent<V>) -> Vec<String> {
        r.iter().map(|(k, _)| k.to_string()).collect()
    }

    #[test]
    fn the_oldest_go_first_by_count_and_by_bytes() {
        let mut r = Recent::new(3, 100);
        for k in ["a", "b", "c", "d"] {
            r.insert(k.into(), k.to_uppercase(), 10);
        }
        assert_eq!(keys(&r), ["b", "c", "d"]);
        assert_eq!((r.len(), r.bytes()), (3, 30));
        assert_eq!(r.get("a"), None);
        // Over the bytes: the oldest go, but never the newest.
        r.insert("e".into(), "E".into(), 85);
        assert_eq!(
            (keys(&r), r.bytes()),
            (vec!["d".to_string(), "e".to_string()], 95)
        );
        r.insert("f".into(), "F".into(), 500);
        assert_eq!((keys(&r), r.bytes()), (vec!["f".to_string()], 500));
    }

    #[test]
    fn insert_makes_newest_replace_keeps_the_place_and_remove_forgets() {
        let mut r = Recent::new(10, 1000);
        for k in ["a", "b", "c"] {
            r.insert(k.into(), 1, 1);
        }
        assert_eq!(r.insert("a".into(), 2, 5), Some(1));
        assert_eq!(keys(&r), ["b", "c", "a"]);
        assert_eq!(r.replace("b".into(), 3, 7), Some(1));
        assert_eq!(r.replace("z".into(), 4, 1), None);
        assert_eq!(keys(&r), ["b", "c", "a", "z"]);
        assert_eq!((r.get("b"), r.bytes()), (Some(&3), 7 + 1 + 5 + 1));
        assert_eq!(r.remove("c"), Some(1));
        assert_eq!(r.remove("c"), None);
        assert_eq!(
            (keys(&r), r.bytes()),
            (vec!["b".into(), "a".into(), "z".into()], 13)
        );
        r.clear();
        assert!(r.is_empty() && r.bytes() == 0 && keys(&r).is_empty());
    }

    #[test]
    fn a_key_placed_again_and_again_leaves_the_order_bounded() {
        let mut r = Recent::new(4, usize::MAX);
        for i in 0..100_000u32 {
            r.insert("hot".into(), i, 1);
            if i % 7 == 0 {
                r.insert(format!("k{i}").into(), i, 1);
                r.remove(&format!("k{i}"));
            }
        }
        assert!(r.order_len() <= 2 * 512 + 1, "{}", r.order_len());
        assert_eq!(
            (keys(&r), r.get("hot")),
            (vec!["hot".into()], Some(&99_999))
        );
        assert_eq!((r.bytes(), r.weights()), (1, 1));
    }
}
