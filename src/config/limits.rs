//! `limits:`: the organism-wide limits (SPEC §4, §14), each with its default, and the check
//! of their least values.

use serde::{Deserialize, Serialize};

use super::Collector;

/// Organism-wide limits (SPEC §4, §14). Every field has a default.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_depth: usize,
    pub max_pending_messages: usize,
    /// Bytes of the payloads of those messages together: an inject past it is refused as
    /// past `max_pending_messages`.
    pub max_pending_bytes: usize,
    pub max_messages_per_thread: u64,
    pub max_concurrent_handlers: usize,
    /// How long `stop` lets running handlers finish, in milliseconds.
    pub stop_grace_ms: u64,
    /// API connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, in milliseconds.
    pub header_timeout_ms: u64,
    /// An API connection with no byte read or written for this long is closed, in
    /// milliseconds (WebSocket pings keep a live session busy).
    pub idle_timeout_ms: u64,
    /// Longest error text kept, published or answered (Lua errors, handler errors,
    /// validator messages), in bytes; a longer one is cut and says how much was cut.
    pub max_error_bytes: usize,
    /// Entries of one WebSocket subscription filter (agents, threads, types together).
    pub max_filter_entries: usize,
    /// Bytes of one filter entry.
    pub max_filter_entry_bytes: usize,
    /// Attributes on one element of a payload; more are refused before parsing on.
    pub max_attributes: usize,
    /// Bytes of history held in memory: finished threads' messages (three quarters) and
    /// the event ring (a quarter), oldest let go of first. The store keeps everything.
    pub max_retained_bytes: usize,
    /// How long one read of the store's history (`/messages`, `/threads`, a thread's log)
    /// may run, in milliseconds; a longer one is stopped and answered 503 `query_timeout`.
    pub max_query_ms: u64,
    /// Bytes of outputs one test-vector answer carries (`…/scripts/{v}/test`, and the cases
    /// a dry-run upload or a deploy runs): past it, each further output's payload is cut and
    /// flagged `truncated`. Its verdict is judged on the whole output first.
    pub max_test_answer_bytes: usize,
    /// Test-vector runs at once per tenant (the organism's own credentials count as one
    /// more); one more is answered 429 `too_many_tests`.
    pub max_tests_at_once: usize,
    /// Messages held at approval gates at once, organism-wide; one more is refused (an
    /// inject 429 `too_many_held`, a handler's output `failed`).
    pub max_held_messages: usize,
    /// Bytes of the payloads held at approval gates at once, organism-wide: refused as
    /// `max_held_messages` is.
    pub max_held_bytes: usize,
    /// How long an inject's `Idempotency-Key` is kept (its first answer replayed), in
    /// milliseconds.
    pub idempotency_window_ms: u64,
    /// Idempotency keys kept at once per tenant (and for the principals of no tenant
    /// together); one more is answered 429 `too_many_idempotency_keys`.
    pub max_idempotency_keys: usize,
    /// Messages a `/ws/messages` client reconnecting from past the event ring gets back from
    /// the store at most (their payloads at most its queue's bytes); a larger gap is
    /// `resync_required`. 0: never from the store.
    pub max_replay_messages: usize,
}

impl Limits {
    /// The input guards of a payload read under these limits.
    pub fn xml_limits(&self) -> crate::xml::XmlLimits {
        crate::xml::XmlLimits {
            max_bytes: self.max_message_bytes,
            max_depth: self.max_depth,
            max_attributes: self.max_attributes,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 1024 * 1024,
            max_depth: 64,
            max_pending_messages: 100_000,
            max_pending_bytes: 1024 * 1024 * 1024,
            max_messages_per_thread: 10_000,
            max_concurrent_handlers: 64,
            stop_grace_ms: 10_000,
            max_connections: 512,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 120_000,
            max_error_bytes: 4096,
            max_filter_entries: 256,
            max_filter_entry_bytes: 256,
            max_attributes: 256,
            max_retained_bytes: 256 * 1024 * 1024,
            max_query_ms: 5_000,
            max_test_answer_bytes: 4 * 1024 * 1024,
            max_tests_at_once: 2,
            max_held_messages: 10_000,
            max_held_bytes: 64 * 1024 * 1024,
            idempotency_window_ms: 24 * 3600 * 1000,
            max_idempotency_keys: 10_000,
            max_replay_messages: 10_000,
        }
    }
}

pub(super) fn check_limits(l: &Limits, c: &mut Collector) {
    // Each limit, its value and the least it may be.
    let checks: [(&str, u64, u64); 21] = [
        ("limits.max_message_bytes", l.max_message_bytes as u64, 1),
        ("limits.max_depth", l.max_depth as u64, 1),
        (
            "limits.max_pending_messages",
            l.max_pending_messages as u64,
            1,
        ),
        ("limits.max_pending_bytes", l.max_pending_bytes as u64, 1024),
        (
            "limits.max_messages_per_thread",
            l.max_messages_per_thread,
            1,
        ),
        (
            "limits.max_concurrent_handlers",
            l.max_concurrent_handlers as u64,
            1,
        ),
        ("limits.max_connections", l.max_connections as u64, 1),
        ("limits.header_timeout_ms", l.header_timeout_ms, 1),
        ("limits.idle_timeout_ms", l.idle_timeout_ms, 1),
        ("limits.max_error_bytes", l.max_error_bytes as u64, 64),
        ("limits.max_filter_entries", l.max_filter_entries as u64, 1),
        (
            "limits.max_filter_entry_bytes",
            l.max_filter_entry_bytes as u64,
            1,
        ),
        ("limits.max_attributes", l.max_attributes as u64, 1),
        (
            "limits.max_retained_bytes",
            l.max_retained_bytes as u64,
            1024 * 1024,
        ),
        ("limits.max_query_ms", l.max_query_ms, 1),
        (
            "limits.max_test_answer_bytes",
            l.max_test_answer_bytes as u64,
            1024,
        ),
        ("limits.max_tests_at_once", l.max_tests_at_once as u64, 1),
        ("limits.max_held_messages", l.max_held_messages as u64, 1),
        ("limits.max_held_bytes", l.max_held_bytes as u64, 1024),
        (
            "limits.idempotency_window_ms",
            l.idempotency_window_ms,
            1000,
        ),
        (
            "limits.max_idempotency_keys",
            l.max_idempotency_keys as u64,
            1,
        ),
    ];
    for (key, value, least) in checks {
        if value < least {
            let message = match least {
                1 => "must be greater than 0".to_string(),
                n => format!("must be at least {n}"),
            };
            c.push(None, Some(key), message);
        }
    }
    // A message's slot is kept in 32 bits beside its thread's number (the text index).
    if l.max_messages_per_thread > MAX_MESSAGES_PER_THREAD {
        c.push(
            None,
            Some("limits.max_messages_per_thread"),
            format!("must be at most {MAX_MESSAGES_PER_THREAD}"),
        );
    }
}

/// `limits.max_messages_per_thread`, at most.
pub const MAX_MESSAGES_PER_THREAD: u64 = u32::MAX as u64;
