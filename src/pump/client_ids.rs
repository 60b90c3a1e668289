//! Message ids chosen by clients (`message_id` on inject): each names one message of the
//! organism. An id is looked for among the ones taken lately (in memory, at most
//! [`MAX_RECENT_BYTES`]) and in the store (`messages_id` index); when the recent ones fill
//! up, the store is let catch up (it then holds all of them) and they are let go of.
//! Without a store, an id is refused while it is among the recent ones.

use std::sync::{Arc, Mutex};

use super::{InjectError, READ_CATCH_UP};
use crate::recent::Recent;
use crate::store::Store;
use crate::sync::lock;

/// Bytes of the ids taken lately, kept in memory, at most.
pub const MAX_RECENT_BYTES: usize = 16 * 1024 * 1024;

pub(crate) struct ClientIds(Mutex<Recent<()>>);

impl Default for ClientIds {
    fn default() -> Self {
        ClientIds(Mutex::new(Recent::new(usize::MAX, MAX_RECENT_BYTES)))
    }
}

impl ClientIds {
    /// Takes `id` for a new message; `MessageIdTaken` if a message has it.
    pub(crate) fn take(&self, id: &str, store: Option<&Store>) -> Result<Arc<str>, InjectError> {
        let taken = || InjectError::MessageIdTaken(id.to_string());
        let mut recent = lock(&self.0);
        if recent.contains(id) {
            return Err(taken());
        }
        if let Some(store) = store {
            if store
                .message_exists(id)
                .map_err(|e| InjectError::StoreFailed(e.to_string()))?
            {
                return Err(taken());
            }
            // Everything published is in the store once it catches up: the recent ones
            // are let go of at once (without a store, the oldest go one by one).
            if recent.bytes() + id.len() > MAX_RECENT_BYTES {
                store.catch_up(READ_CATCH_UP);
                recent.clear();
            }
        }
        let id: Arc<str> = Arc::from(id);
        recent.insert(id.clone(), (), id.len());
        Ok(id)
    }

    /// Gives back an id taken for a message that was not logged after all.
    pub(crate) fn give_back(&self, id: &str) {
        lock(&self.0).remove(id);
    }
}
