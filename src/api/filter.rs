//! What a WebSocket client subscribed to: threads, agents (globs like `shout*`), event types,
//! payload types. An empty list means "all". A filter applies only to events that carry its
//! dimension: an agents filter does not hide `thread_updated`, which names no agent.

use serde::{Deserialize, Serialize};

use crate::events::{Event, EventKind, EVENT_NAMES};
use crate::threads::glob_match;
use crate::xml::type_named;

/// The range of `coalesce_ms`: at least a frame of a 100 Hz display, at most a minute.
pub const COALESCE_MS: (u64, u64) = (10, 60_000);
/// The range of `max_messages_per_s`, and of `max_deltas_per_s`.
pub const MESSAGES_PER_S: (u64, u64) = (1, 1_000_000);

/// A subscription filter. Deserialized from a `subscribe` command (fields at the top level or
/// under `filter`) or from the connection's query string.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    #[serde(default)]
    pub threads: Vec<String>,
    #[serde(default)]
    pub agents: Vec<String>,
    #[serde(default)]
    pub events: Vec<String>,
    #[serde(default)]
    pub payload_types: Vec<String>,
    /// `/ws`: each agent's `agent_state` events are held and only its latest sent, every
    /// this many milliseconds, in one `agent_states` frame ([`COALESCE_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_ms: Option<u64>,
    /// `/ws`: `message` and `message_status` events past this many in a second are not
    /// sent; each such run is told by a `folded` frame ([`MESSAGES_PER_S`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages_per_s: Option<u64>,
    /// `/ws`: `delta` events past this many in a second are not sent; each such run is told
    /// by a `folded` frame of `kind: delta` (the message they end in is the record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deltas_per_s: Option<u64>,
    /// Events of threads with these labels (`key:value`, `key:v1,v2` for either; all must
    /// hold), without these (`label!`), with a label of this key (`has_label`) or without
    /// (`no_label`): `/threads`'s label tests, held against a thread's labels as they are
    /// when its event is sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label: Vec<String>,
    #[serde(default, rename = "label!", skip_serializing_if = "Vec::is_empty")]
    pub not_label: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub has_label: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_label: Vec<String>,
    /// The label tests read ([`Filter::prepare`]).
    #[serde(skip)]
    label_tests: Vec<crate::threads::LabelTest>,
    /// `agents` compiled ([`Filter::prepare`]): one automaton for every glob, so matching a
    /// name costs time linear in the name, however many globs there are.
    #[serde(skip)]
    compiled: AgentGlobs,
}

/// The agent globs as one anchored regular expression (`*` is `.*`, `?` is `.`).
#[derive(Debug, Clone, Default)]
struct AgentGlobs(Option<regex::Regex>);

impl PartialEq for AgentGlobs {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_ref().map(regex::Regex::as_str) == other.0.as_ref().map(regex::Regex::as_str)
    }
}

impl Eq for AgentGlobs {}

/// Compiled size of one filter's agent globs, at most (the regex crate's own limit).
const GLOBS_SIZE_LIMIT: usize = 1 << 20;

fn compile_globs(globs: &[String]) -> Result<Option<regex::Regex>, String> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut pattern = String::from("^(?:");
    for (i, g) in globs.iter().enumerate() {
        if i > 0 {
            pattern.push('|');
        }
        for ch in g.chars() {
            match ch {
                '*' => pattern.push_str(".*"),
                '?' => pattern.push('.'),
                c => pattern.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
            }
        }
    }
    pattern.push_str(")$");
    regex::RegexBuilder::new(&pattern)
        .size_limit(GLOBS_SIZE_LIMIT)
        .dfa_size_limit(GLOBS_SIZE_LIMIT)
        .build()
        .map(Some)
        .map_err(|_| {
            "the agent globs are too complex to match; use fewer or simpler ones".to_string()
        })
}

impl Filter {
    /// Checks the filter against the limits and compiles its globs; the error says what is
    /// wrong and where (`agents`, `events`, …).
    pub fn prepare(
        &mut self,
        limits: &crate::config::Limits,
    ) -> Result<(), (String, &'static str)> {
        let lists: [(&'static str, &Vec<String>); 4] = [
            ("threads", &self.threads),
            ("agents", &self.agents),
            ("events", &self.events),
            ("payload_types", &self.payload_types),
        ];
        let entries: usize = lists.iter().map(|(_, l)| l.len()).sum();
        if entries > limits.max_filter_entries {
            return Err((
                format!(
                    "the filter has {entries} entries; limits.max_filter_entries is {}",
                    limits.max_filter_entries
                ),
                "filter",
            ));
        }
        for (at, list) in lists {
            if let Some(long) = list
                .iter()
                .find(|e| e.len() > limits.max_filter_entry_bytes)
            {
                return Err((
                    format!(
                        "an entry of {} bytes; limits.max_filter_entry_bytes is {}",
                        long.len(),
                        limits.max_filter_entry_bytes
                    ),
                    at,
                ));
            }
        }
        self.check().map_err(|m| (m, "events"))?;
        for (at, value, (low, high)) in [
            ("coalesce_ms", self.coalesce_ms, COALESCE_MS),
            (
                "max_messages_per_s",
                self.max_messages_per_s,
                MESSAGES_PER_S,
            ),
            ("max_deltas_per_s", self.max_deltas_per_s, MESSAGES_PER_S),
        ] {
            if let Some(v) = value.filter(|v| !(low..=high).contains(v)) {
                return Err((format!("{at} is {v}; it must be {low} to {high}"), at));
            }
        }
        self.compiled = AgentGlobs(compile_globs(&self.agents).map_err(|m| (m, "agents"))?);
        let (is, not) = (&self.label, &self.not_label);
        self.label_tests = super::labels::tests_of(is, not, &self.has_label, &self.no_label)
            .map_err(|e| (e.body.message, "label"))?;
        Ok(())
    }

    /// The label tests a thread's events must pass (none: every thread's).
    pub fn label_tests(&self) -> &[crate::threads::LabelTest] {
        &self.label_tests
    }

    /// Checks the event names; an unknown one is an error naming it.
    fn check(&self) -> Result<(), String> {
        for e in &self.events {
            if !EVENT_NAMES.contains(&e.as_str()) {
                return Err(format!(
                    "unknown event type `{e}` (known: {})",
                    EVENT_NAMES.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// From comma-separated query values.
    pub fn from_query(
        threads: Option<&str>,
        agents: Option<&str>,
        events: Option<&str>,
        payload_types: Option<&str>,
    ) -> Filter {
        let split = |s: Option<&str>| -> Vec<String> {
            s.map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
        };
        Filter {
            threads: split(threads),
            agents: split(agents),
            events: split(events),
            payload_types: split(payload_types),
            coalesce_ms: None,
            max_messages_per_s: None,
            max_deltas_per_s: None,
            ..Filter::default()
        }
    }

    fn agent_ok(&self, agent: &str) -> bool {
        match &self.compiled.0 {
            Some(re) => re.is_match(agent),
            // Not prepared (built in code): the globs one by one.
            None => self.agents.iter().any(|g| glob_match(g, agent)),
        }
    }

    /// Whether events named `name` are asked for (none named: every one).
    fn event_ok(&self, name: &str) -> bool {
        self.events.is_empty() || self.events.iter().any(|e| e == name)
    }

    /// For `/ws`: does this event pass?
    pub fn passes(&self, event: &Event) -> bool {
        let kind = &event.kind;
        if matches!(kind, EventKind::Omitted) || !self.event_ok(kind.name()) {
            return false;
        }
        if !self.threads.is_empty() {
            if let Some(t) = kind.thread_id() {
                if !self.threads.iter().any(|x| x == t) {
                    return false;
                }
            }
        }
        if !self.agents.is_empty() {
            let agents = kind.agents();
            if !agents.is_empty() && !agents.iter().any(|a| self.agent_ok(a)) {
                return false;
            }
        }
        if !self.payload_types.is_empty() {
            if let EventKind::Message { message } = kind {
                if !self.type_ok(message.payload_type.as_deref()) {
                    return false;
                }
            }
        }
        true
    }

    fn type_ok(&self, payload_type: Option<&str>) -> bool {
        payload_type.is_some_and(|t| self.payload_types.iter().any(|w| type_named(t, w)))
    }

    /// Whether every `message` event passes, whatever its thread, agents or type (`/ws`:
    /// and `message` is among the events asked for, or none are named).
    pub fn takes_every_message(&self, events_too: bool) -> bool {
        self.threads.is_empty()
            && self.agents.is_empty()
            && self.payload_types.is_empty()
            && (!events_too || self.event_ok("message"))
    }

    /// For `/ws/messages`: messages, and the status changes of messages, that match.
    pub fn passes_message(&self, event: &Event) -> bool {
        let (thread, from, to, payload_type) = match &event.kind {
            EventKind::Message { message } => (
                &*message.thread_id,
                &*message.from,
                message.to.as_deref(),
                message.payload_type.as_deref(),
            ),
            EventKind::MessageStatus {
                thread_id,
                about: Some(a),
                ..
            } => (
                &**thread_id,
                &*a.from,
                a.to.as_deref(),
                a.payload_type.as_deref(),
            ),
            _ => return false,
        };
        (self.threads.is_empty() || self.threads.iter().any(|t| t == thread))
            && (self.agents.is_empty()
                || self.agent_ok(from)
                || to.is_some_and(|t| self.agent_ok(t)))
            && (self.payload_types.is_empty() || self.type_ok(payload_type))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_globs_match_as_the_plain_matcher_does() {
        let globs = ["shout*", "*er", "g?eeter", "a*b*c", "x.y", "[q]"];
        let names = [
            "shouter", "greeter", "aXXbYYc", "aXXbY", "x.y", "xzy", "[q]", "q", "",
        ];
        for g in globs {
            let mut f = Filter {
                agents: vec![g.to_string()],
                ..Filter::default()
            };
            f.prepare(&crate::config::Limits::default()).unwrap();
            for n in names {
                assert_eq!(f.agent_ok(n), glob_match(g, n), "{g} on {n}");
            }
        }
    }

    #[test]
    fn unknown_event_names_are_refused() {
        let f = Filter {
            events: vec!["message".into(), "mesage".into()],
            ..Default::default()
        };
        assert!(f.check().unwrap_err().contains("`mesage`"));
    }
}
