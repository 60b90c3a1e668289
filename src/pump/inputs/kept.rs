//! The decided inputs kept in memory (the newest), for a second decider's answer and for an
//! organism without a store: each tenant's apart from every other's and from the
//! organism's own, so one tenant's many decisions never push out another's.

use std::sync::Arc;

use crate::hash::SeededMap;
use crate::recent::Recent;
use crate::threads::InputRow;

/// Decided inputs kept for each tenant (and for the organism's own listeners): at most
/// this many...
pub(super) const RECENT_DECIDED: usize = 4096;
/// ...and at most this many bytes of them (payloads, prompts, reasons).
pub(super) const RECENT_DECIDED_BYTES: usize = 16 * 1024 * 1024;

/// About how many bytes holding `r` costs.
pub(super) fn weight(r: &InputRow) -> usize {
    256 + r.payload_xml.len()
        + r.prompt.as_ref().map_or(0, String::len)
        + r.reason.as_ref().map_or(0, String::len)
        + r.decision.as_ref().map_or(0, String::len)
}

/// The newest decided inputs, by tenant (`None`: the organism's own), each by id.
#[derive(Default)]
pub(super) struct Kept(SeededMap<Option<String>, Recent<Arc<InputRow>>>);

impl Kept {
    /// Keeps `row`, in the place of the same input's if it is kept, else as its tenant's
    /// newest (past [`RECENT_DECIDED`] or [`RECENT_DECIDED_BYTES`] that tenant's oldest go).
    pub(super) fn replace(&mut self, row: Arc<InputRow>) {
        let w = weight(&row);
        self.0
            .entry(row.tenant.clone())
            .or_insert_with(|| Recent::new(RECENT_DECIDED, RECENT_DECIDED_BYTES))
            .replace(row.id.clone(), row, w);
    }

    pub(super) fn get(&self, id: &str) -> Option<&Arc<InputRow>> {
        self.0.values().find_map(|kept| kept.get(id))
    }

    /// The kept inputs of `tenant` (`Some`), or of everyone (`None`).
    pub(super) fn of<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<InputRow>> + 'a {
        self.0
            .iter()
            .filter(move |(t, _)| tenant.is_none_or(|want| t.as_deref() == Some(want)))
            .flat_map(|(_, kept)| kept.iter().map(|(_, row)| row))
    }
}

#[cfg(test)]
mod tests {
    use super::{Arc, InputRow, Kept, RECENT_DECIDED};
    use crate::threads::{InputKind, InputStatus};
    use crate::time::Timestamp;

    fn row(id: &str, tenant: Option<&str>) -> Arc<InputRow> {
        Arc::new(InputRow {
            id: Arc::from(id),
            kind: InputKind::Approval,
            status: InputStatus::Approved,
            thread_id: Arc::from("t"),
            message_id: Arc::from("m"),
            listener: Arc::from("l"),
            tenant: tenant.map(str::to_string),
            from: Arc::from("api"),
            parent_id: None,
            slot_index: 0,
            payload_type: Arc::from("p"),
            payload_xml: Arc::new("<p/>".to_string()),
            prompt: None,
            requested_by: None,
            created: Timestamp(0),
            expires: None,
            decided_by: Some("key:alice".into()),
            decided: Some(Timestamp(1)),
            decision: Some("approve".into()),
            reason: None,
            result: None,
        })
    }

    /// The attacker is acme deciding more inputs than are kept: its oldest go, beta's and
    /// the organism's stay, each found by id and listed for its own tenant only.
    #[test]
    fn one_tenants_decisions_never_push_out_anothers() {
        let mut kept = Kept::default();
        kept.replace(row("beta-1", Some("beta")));
        kept.replace(row("own-1", None));
        for n in 0..=RECENT_DECIDED {
            kept.replace(row(&format!("acme-{n}"), Some("acme")));
        }
        assert!(kept.get("beta-1").is_some(), "beta's decision is kept");
        assert!(kept.get("own-1").is_some(), "the organism's is kept");
        assert!(kept.get("acme-0").is_none(), "acme's oldest went");
        assert!(kept.get(&format!("acme-{RECENT_DECIDED}")).is_some());
        let beta: Vec<_> = kept.of(Some("beta")).map(|r| &*r.id).collect();
        assert_eq!(beta, ["beta-1"]);
        assert_eq!(kept.of(Some("acme")).count(), RECENT_DECIDED);
        assert_eq!(kept.of(None).count(), RECENT_DECIDED + 2);
        // A decision known again takes its own place, not a new one.
        kept.replace(row("beta-1", Some("beta")));
        assert_eq!(kept.of(Some("beta")).count(), 1);
    }
}
