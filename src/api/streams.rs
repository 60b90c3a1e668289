//! Each tenant's event streams open at once (`/ws`, `/ws/messages`, a thread's Server-Sent
//! Events), at most `tenants.<t>.max_streams`: so one tenant cannot hold the connections
//! (`limits.max_connections`) and queued frames the server has for every tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::OrganismConfig;

/// The streams open, by tenant.
#[derive(Default)]
pub(in crate::api) struct Streams(Mutex<HashMap<String, usize>>);

/// One stream of a tenant's, counted for as long as it is held.
pub(in crate::api) struct StreamSlot {
    streams: Arc<Streams>,
    tenant: String,
}

impl Streams {
    /// A slot for a stream of `tenant` (none for a credential without one), or why not: the
    /// tenant has `tenants.<t>.max_streams` open.
    pub(in crate::api) fn take(
        self: &Arc<Self>,
        config: &OrganismConfig,
        tenant: Option<&str>,
    ) -> Result<Option<StreamSlot>, String> {
        let Some(tenant) = tenant else {
            return Ok(None);
        };
        let (quotas, key) = config.tenants.of(tenant);
        let mut open = crate::sync::lock(&self.0);
        let n = open.entry(tenant.to_string()).or_default();
        if *n >= quotas.max_streams {
            return Err(format!(
                "{} event streams open, the limit ({key}.max_streams)",
                quotas.max_streams
            ));
        }
        *n += 1;
        Ok(Some(StreamSlot {
            streams: self.clone(),
            tenant: tenant.to_string(),
        }))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = crate::sync::lock(&self.streams.0);
        if let Some(n) = open.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}
