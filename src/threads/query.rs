//! Filtered, paginated reads of the in-memory log: what `/threads` and `/messages` serve.
//!
//! Order is stable: a thread's messages by slot; the global log by (timestamp, thread, slot),
//! oldest first; threads newest first by creation. `total` counts every match, so a client
//! can page to the end or jump to the newest page with `offset = total - limit`.

use super::{lock, MessageRecord, MessageStatus, ThreadInfo, ThreadRegistry, ThreadStatus};
use crate::time::Timestamp;

/// The largest page a list returns.
pub const MAX_PAGE: usize = 1000;
/// The page size when none is asked for.
pub const DEFAULT_PAGE: usize = 50;

/// A page request; `limit` is clamped to [`MAX_PAGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: usize,
    pub offset: usize,
}

impl Page {
    /// Every item, in one page.
    pub const ALL: Page = Page {
        limit: usize::MAX,
        offset: 0,
    };

    pub fn new(limit: Option<usize>, offset: Option<usize>) -> Self {
        Page {
            limit: limit.unwrap_or(DEFAULT_PAGE).min(MAX_PAGE),
            offset: offset.unwrap_or(0),
        }
    }

    /// The page of `all` this request selects, with the total.
    pub fn cut<T>(&self, all: Vec<T>) -> Paged<T> {
        let total = all.len() as u64;
        let items = all.into_iter().skip(self.offset).take(self.limit).collect();
        Paged {
            items,
            total,
            limit: self.limit,
            offset: self.offset,
        }
    }
}

impl Default for Page {
    fn default() -> Self {
        Page::new(None, None)
    }
}

/// One page of a list, with the total number of matches.
#[derive(Debug, Clone)]
pub struct Paged<T> {
    pub items: Vec<T>,
    pub total: u64,
    pub limit: usize,
    pub offset: usize,
}

/// Filters of `/messages` (every field optional; all given must match).
#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    /// Sender or receiver.
    pub agent: Option<String>,
    pub thread: Option<String>,
    /// `{namespace}Local` or just `Local`.
    pub payload_type: Option<String>,
    pub status: Option<MessageStatus>,
    /// Logged at or after.
    pub since: Option<Timestamp>,
    /// Logged before.
    pub until: Option<Timestamp>,
    /// Only messages whose sender or receiver is one of these (a tenant's listeners).
    pub within: Option<Vec<String>>,
}

/// `*` matches any run of characters, `?` any one character; everything else is literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

impl MessageFilter {
    pub fn matches(&self, m: &MessageRecord) -> bool {
        self.agent
            .as_deref()
            .is_none_or(|a| &*m.from == a || m.to.as_deref() == Some(a))
            && self.thread.as_deref().is_none_or(|t| &*m.thread_id == t)
            && self.payload_type.as_deref().is_none_or(|p| {
                m.payload_type
                    .as_deref()
                    .is_some_and(|s| crate::xml::type_named(s, p))
            })
            && self.status.is_none_or(|s| m.status == s)
            && self.since.is_none_or(|s| m.timestamp >= s)
            && self.until.is_none_or(|u| m.timestamp < u)
            && self.within.as_ref().is_none_or(|set| {
                set.iter()
                    .any(|a| &*m.from == a || m.to.as_deref() == Some(a))
            })
    }
}

/// Filters of `/threads`.
#[derive(Debug, Clone, Default)]
pub struct ThreadFilter {
    pub status: Option<ThreadStatus>,
    /// A participant.
    pub agent: Option<String>,
    /// Active at or after: last activity at or after this.
    pub since: Option<Timestamp>,
    /// Created before this.
    pub until: Option<Timestamp>,
    /// Only threads in which one of these took part (a tenant's listeners).
    pub within: Option<Vec<String>>,
    /// Every one of these holds (`/threads?label=…`).
    pub labels: Vec<LabelTest>,
    /// In the thread's id, a label's key or value, or its error.
    pub q: Option<String>,
}

/// One test of a thread's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelTest {
    /// `label=k:v1,v2`: the label `k` is one of these values.
    Is(String, Vec<String>),
    /// `label!=k:v`: the thread has no label `k: v`.
    IsNot(String, String),
    /// `has_label=k`.
    Has(String),
    /// `no_label=k`.
    Lacks(String),
}

impl LabelTest {
    pub fn holds(&self, labels: Option<&super::Labels>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        match self {
            LabelTest::Is(k, vs) => get(k).is_some_and(|v| vs.contains(v)),
            LabelTest::IsNot(k, v) => get(k) != Some(v),
            LabelTest::Has(k) => get(k).is_some(),
            LabelTest::Lacks(k) => get(k).is_none(),
        }
    }
}

/// Whether `q` is in the thread's id, a label's key or value, or its error.
fn mentions(t: &ThreadInfo, q: &str) -> bool {
    t.id.contains(q)
        || t.error.as_deref().is_some_and(|e| e.contains(q))
        || t.labels
            .as_deref()
            .is_some_and(|l| l.iter().any(|(k, v)| k.contains(q) || v.contains(q)))
}

impl ThreadFilter {
    pub fn matches(&self, t: &ThreadInfo) -> bool {
        self.status.is_none_or(|s| t.status == s)
            && self
                .agent
                .as_deref()
                .is_none_or(|a| t.participants.iter().any(|p| p == a))
            && self.since.is_none_or(|s| t.last_activity >= s)
            && self.until.is_none_or(|u| t.created_at < u)
            && self
                .within
                .as_ref()
                .is_none_or(|set| t.participants.iter().any(|p| set.contains(p)))
            && self.labels.iter().all(|l| l.holds(t.labels.as_deref()))
            && self.q.as_deref().is_none_or(|q| mentions(t, q))
    }
}

impl ThreadRegistry {
    /// The message `id`, if a thread held here has it (every retained message looked at).
    pub fn find_message(&self, id: &str) -> Option<MessageRecord> {
        self.shards.iter().find_map(|s| {
            let s = lock(s);
            s.threads
                .values()
                .find_map(|e| e.messages.iter().find(|m| &*m.id == id).cloned())
        })
    }

    /// One page of the global message log.
    pub fn query_messages(&self, filter: &MessageFilter, page: Page) -> Paged<MessageRecord> {
        let mut all: Vec<MessageRecord> = match &filter.thread {
            Some(t) => self
                .messages(t)
                .unwrap_or_default()
                .into_iter()
                .filter(|m| filter.matches(m))
                .collect(),
            None => self
                .shards
                .iter()
                .flat_map(|s| {
                    let s = lock(s);
                    s.threads
                        .values()
                        .flat_map(|e| e.messages.iter().filter(|m| filter.matches(m)).cloned())
                        .collect::<Vec<_>>()
                })
                .collect(),
        };
        all.sort_by(|a, b| {
            (a.timestamp, &a.thread_id, a.slot_index).cmp(&(
                b.timestamp,
                &b.thread_id,
                b.slot_index,
            ))
        });
        page.cut(all)
    }

    /// One page of threads, newest first.
    pub fn query_threads(&self, filter: &ThreadFilter, page: Page) -> Paged<ThreadInfo> {
        let all = self
            .list()
            .into_iter()
            .filter(|t| filter.matches(t))
            .collect();
        page.cut(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_a_shell() {
        assert!(glob_match("shout*", "shouter"));
        assert!(glob_match("*er", "greeter"));
        assert!(glob_match("g?eeter", "greeter"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("shout*", "greeter"));
        assert!(!glob_match("greeter", "greeter2"));
        assert!(!glob_match("a*b", "aXXbY"));
    }

    use crate::threads::NewMessage;
    use std::sync::Arc;

    fn append(r: &ThreadRegistry, t: &str, from: &str, to: &str, ty: &str) {
        r.append(
            t,
            NewMessage {
                id: Arc::from(format!("{t}-{from}-{to}")),
                parent_id: None,
                from: Arc::from(from),
                to: Some(Arc::from(to)),
                payload_type: Some(ty.into()),
                payload_xml: crate::xml::SharedXml::new("<X/>".into()),
                status: MessageStatus::Terminal,
                error: None,
                origin: crate::threads::Origin::inject(),
            },
        )
        .unwrap();
    }

    #[test]
    fn filters_and_pages_are_exact() {
        let r = ThreadRegistry::new(100, 100, usize::MAX);
        let a = r.open(Some("a"), None).unwrap().id;
        let b = r.open(Some("b"), None).unwrap().id;
        append(&r, &a, "api", "greeter", "Greeting");
        append(&r, &a, "greeter", "shouter", "{urn:x}Shouted");
        append(&r, &b, "api", "shouter", "{urn:x}Shouted");

        let all = r.query_messages(&MessageFilter::default(), Page::default());
        assert_eq!(all.total, 3);
        let shouter = MessageFilter {
            agent: Some("shouter".into()),
            ..Default::default()
        };
        assert_eq!(r.query_messages(&shouter, Page::default()).total, 2);
        let typed = MessageFilter {
            payload_type: Some("Shouted".into()),
            thread: Some("a".into()),
            ..Default::default()
        };
        assert_eq!(r.query_messages(&typed, Page::default()).total, 1);

        let past_end = r.query_messages(&MessageFilter::default(), Page::new(Some(10), Some(7)));
        assert!(past_end.items.is_empty());
        assert_eq!(past_end.total, 3);
        let zero = r.query_messages(&MessageFilter::default(), Page::new(Some(0), None));
        assert!(zero.items.is_empty());
        assert_eq!(zero.total, 3);
        assert_eq!(Page::new(Some(5000), None).limit, MAX_PAGE);

        let by_agent = ThreadFilter {
            agent: Some("greeter".into()),
            ..Default::default()
        };
        let threads = r.query_threads(&by_agent, Page::default());
        assert_eq!(threads.total, 1);
        assert_eq!(threads.items[0].id, "a");
        let in_a = MessageFilter {
            thread: Some("a".into()),
            ..Default::default()
        };
        assert_eq!(
            r.query_messages(&in_a, Page::new(Some(1), Some(1))).items[0].slot_index,
            1
        );
    }
}
