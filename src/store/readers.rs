//! The store's connections for reads: [`READERS`] of them, each taken by one read at a time
//! and given back when it ends, so a slow read (up to `limits.max_query_ms`) holds one while
//! the others go on. (The API's reads take turns, leaving one for the pump: `api::turns`.)

use std::sync::{Condvar, Mutex, PoisonError};

use rusqlite::Connection;

/// Connections the store reads through, at most this many reads at once.
pub const READERS: usize = 5;

pub(super) struct Readers {
    idle: Mutex<Vec<Connection>>,
    freed: Condvar,
}

/// One connection taken for a read; given back when dropped.
pub(super) struct Lease<'a> {
    readers: &'a Readers,
    conn: Option<Connection>,
}

impl Readers {
    pub(super) fn new(conns: Vec<Connection>) -> Self {
        Readers {
            idle: Mutex::new(conns),
            freed: Condvar::new(),
        }
    }

    /// A connection for one read: a free one, or the first given back.
    pub(super) fn take(&self) -> Lease<'_> {
        let mut idle = crate::sync::lock(&self.idle);
        loop {
            if let Some(conn) = idle.pop() {
                return Lease {
                    readers: self,
                    conn: Some(conn),
                };
            }
            idle = self
                .freed
                .wait(idle)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Lease<'_> {
    /// The connection (always there until the lease is dropped).
    pub(super) fn conn(&mut self) -> Option<&mut Connection> {
        self.conn.as_mut()
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            crate::sync::lock(&self.readers.idle).push(conn);
            self.readers.freed.notify_one();
        }
    }
}
