//! History reads a request makes, off the runtime's workers: a read takes up to
//! `limits.max_query_ms` and may wait for one of the store's read connections
//! (`store::READERS`), without holding up the requests and sessions those workers serve.

use axum::http::StatusCode;

use super::auth::Scope;
use super::error::ApiError;
use crate::threads::{MessageFilter, MessageRecord, Page};

/// Runs `f` on the blocking pool: its answer, or 500 if it panicked.
pub(super) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    crate::events::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}

/// Every message of a thread that `scope` sees, in slot order (none for an unknown thread).
pub(super) async fn all_messages(
    organism: &crate::Organism,
    id: &str,
    scope: &Scope,
) -> Result<Vec<MessageRecord>, ApiError> {
    Ok(thread_page(organism, id, scope, Page::ALL, false)
        .await?
        .map(|(p, _)| p.items)
        .unwrap_or_default())
}

/// One page of a thread's messages that `scope` sees (all of them for an organism-wide
/// principal; a tenant's, with totals to match, through the message filter), without what
/// a rewind superseded unless `superseded`; and the thread's rewinds.
type ThreadPage = (
    crate::threads::Paged<MessageRecord>,
    Vec<crate::threads::Rewind>,
);
pub(super) async fn thread_page(
    organism: &crate::Organism,
    id: &str,
    scope: &Scope,
    page: Page,
    superseded: bool,
) -> Result<Option<ThreadPage>, ApiError> {
    let (o, id, scope) = (organism.clone(), id.to_string(), scope.clone());
    off_runtime(move || read_thread_page(&o, &id, &scope, page, superseded)).await?
}

fn read_thread_page(
    organism: &crate::Organism,
    id: &str,
    scope: &Scope,
    page: Page,
    superseded: bool,
) -> Result<Option<ThreadPage>, ApiError> {
    let history = organism.history();
    let rewinds = history.rewinds(id)?;
    let hide = !superseded && !rewinds.is_empty();
    let ask = if hide { Page::ALL } else { page };
    let found = if scope.everything() {
        history.thread_page(id, ask)?
    } else {
        let filter = MessageFilter {
            thread: Some(id.to_string()),
            within: scope.within(),
            ..Default::default()
        };
        Some(history.query_messages(&filter, ask)?)
    };
    let found = match found {
        Some(all) if hide => {
            let shown = all.items.into_iter();
            let shown = shown.filter(|m| !crate::threads::superseded(&rewinds, m.slot_index));
            Some(page.cut(shown.collect()))
        }
        found => found,
    };
    Ok(found.map(|p| (p, rewinds)))
}
