//! The API keys of an organism, in its store file (`api_keys`, schema v5): each key's id,
//! name, role, tenant, times, and the hash of its secret (never the secret). A [`KeyTable`]
//! has its own connection and takes no lock of the file, so `agentserver keys` changes the
//! keys of a running server (SQLite's own locking orders the writes).
//!
//! Lookups are served from a cache of the rows found, checked on every lookup against a
//! stamp file beside the store (`<store>.keys-stamp`), which every change of a key (here or
//! in another process) replaces after its commit. The stamp is held open and looked at by
//! one `fstat` at most once a millisecond ([`super::watched`]), instead of a read of a file
//! the store's writer is busy with: a key changed through this table is seen by the next
//! lookup, one changed by another process by every lookup a millisecond after.
//!
//! What a key is, how its secret is made and checked, is `access::key`; this is
//! only where keys are kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

use super::open::side_connection;
use super::watched::{Version, Watched};
use super::{err, ms, StoreError};
use crate::config::Role;
use crate::sync::lock;
use crate::time::Timestamp;

/// One key as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    /// The public part of the key, by which it is found (`ask_<id>_…`).
    pub id: String,
    pub name: String,
    /// The hash of the secret, hex.
    pub hash: String,
    pub role: Role,
    pub tenant: Option<String>,
    pub created: Timestamp,
    pub expires: Option<Timestamp>,
    pub last_used: Option<Timestamp>,
    pub revoked: Option<Timestamp>,
    /// The key's own inject rate and burst, over `auth.inject_per_s` and `auth.burst`.
    pub inject_per_s: Option<u32>,
    pub burst: Option<u32>,
}

/// The `api_keys` table of one store file.
pub struct KeyTable {
    path: PathBuf,
    /// `<store>.keys-stamp`.
    stamp: PathBuf,
    conn: Mutex<Connection>,
    cache: Mutex<Cache>,
}

/// Rows found, valid while the stamp file is the one they were read under.
struct Cache {
    watched: Watched,
    /// The stamp the rows were read under (`None`: no stamp, or it could not be read).
    stamp: Option<Version>,
    /// Counts the times the rows were forgotten: a row read from the file is kept only if
    /// none happened while it was read.
    generation: u64,
    rows: crate::hash::SeededMap<String, Arc<KeyRow>>,
}

impl Cache {
    /// Looks at the stamp (forgetting the rows if it changed); whether rows may be kept.
    fn check(&mut self) -> bool {
        let stamp = self.watched.version().ok().flatten();
        if stamp != self.stamp || stamp.is_none() {
            self.forget();
            self.stamp = stamp;
        }
        stamp.is_some()
    }

    /// After a change here: the rows are forgotten and the next lookup looks at the stamp.
    fn forget(&mut self) {
        self.rows.clear();
        self.generation += 1;
        self.watched.forget();
    }
}

/// Rows the cache holds at most; it starts again empty when full.
const MAX_CACHED_KEYS: usize = 4096;

const COLUMNS: &str =
    "id, name, hash, role, tenant, created, expires, last_used, revoked, inject_per_s, burst";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRow> {
    let time = |i: usize| -> rusqlite::Result<Option<Timestamp>> {
        Ok(r.get::<_, Option<i64>>(i)?
            .map(|t| Timestamp(t.max(0) as u64)))
    };
    Ok(KeyRow {
        id: r.get(0)?,
        name: r.get(1)?,
        hash: r.get(2)?,
        role: {
            let role: String = r.get(3)?;
            Role::parse(&role).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    3,
                    rusqlite::types::Type::Text,
                    format!("no role `{}`", crate::clip::clip(role, 64)).into(),
                )
            })?
        },
        tenant: r.get(4)?,
        created: time(5)?.unwrap_or(Timestamp(0)),
        expires: time(6)?,
        last_used: time(7)?,
        revoked: time(8)?,
        inject_per_s: r.get(9)?,
        burst: r.get(10)?,
    })
}

/// Why a key could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddKeyError {
    #[error("a key named `{0}` exists; revoke it first or choose another name")]
    NameTaken(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl KeyTable {
    /// Opens the keys of the store file at `path`, creating and migrating the file if need
    /// be (as the server would).
    pub fn open(path: &Path) -> Result<KeyTable, StoreError> {
        let stamp = super::beside(path, ".keys-stamp");
        let table = KeyTable {
            path: path.to_path_buf(),
            conn: Mutex::new(side_connection(path)?),
            cache: Mutex::new(Cache {
                watched: Watched::new(&stamp),
                stamp: None,
                generation: 0,
                rows: Default::default(),
            }),
            stamp,
        };
        // Without a stamp nothing is cached (every lookup reads the file): make one.
        if !table.stamp.exists() {
            if let Err(e) = table.signal() {
                tracing::warn!("API keys will be read from the store on every request: {e}");
            }
        }
        Ok(table)
    }

    /// Tells every reader of this store's keys (this process's and others') that a key
    /// changed: a new stamp file, by rename, after the change was committed.
    fn signal(&self) -> Result<(), StoreError> {
        let stamp = &self.stamp;
        let tmp = super::beside(stamp, &format!(".{}", std::process::id()));
        let written = std::fs::write(&tmp, Timestamp::now().0.to_string())
            .and_then(|()| std::fs::rename(&tmp, stamp));
        lock(&self.cache).forget();
        written.map_err(|e| {
            err(
                &self.path,
                format!(
                    "the key changed, but {} cannot be written to tell a running server: {e}; restart it",
                    stamp.display()
                ),
            )
        })
    }
    fn fail(&self, e: rusqlite::Error) -> StoreError {
        err(&self.path, e)
    }

    /// Adds a key. Names are unique among keys not revoked.
    pub fn add(&self, k: &KeyRow) -> Result<(), AddKeyError> {
        let conn = lock(&self.conn);
        let done = conn.execute(
            "INSERT INTO api_keys (id, name, hash, role, tenant, created, expires, inject_per_s, burst) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                k.id,
                k.name,
                k.hash,
                k.role.as_str(),
                k.tenant,
                ms(k.created),
                k.expires.map(ms),
                k.inject_per_s,
                k.burst
            ],
        );
        match done {
            Ok(_) => {
                drop(conn);
                Ok(self.signal()?)
            }
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(AddKeyError::NameTaken(k.name.clone()))
            }
            Err(e) => Err(self.fail(e).into()),
        }
    }

    /// The key with public id `id`, revoked or not (its `last_used` as of this table's last
    /// `touch`; another process's touches are in [`KeyTable::list`]).
    pub fn find(&self, id: &str) -> Result<Option<Arc<KeyRow>>, StoreError> {
        let generation = {
            let mut cache = lock(&self.cache);
            if let (true, Some(r)) = (cache.check(), cache.rows.get(id)) {
                return Ok(Some(r.clone()));
            }
            cache.stamp.is_some().then_some(cache.generation)
        };
        let found = {
            let conn = lock(&self.conn);
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = ?1"))
                .and_then(|mut st| st.query_row([id], row).optional())
                .map_err(|e| self.fail(e))?
                .map(Arc::new)
        };
        if let (Some(r), Some(generation)) = (&found, generation) {
            let mut cache = lock(&self.cache);
            // Kept only if nothing was forgotten since it was read: a change since then is
            // seen.
            if cache.generation == generation {
                if cache.rows.len() >= MAX_CACHED_KEYS {
                    cache.rows.clear();
                }
                cache.rows.insert(id.to_string(), r.clone());
            }
        }
        Ok(found)
    }

    /// Every key, revoked ones included, oldest first.
    pub fn list(&self) -> Result<Vec<KeyRow>, StoreError> {
        let conn = lock(&self.conn);
        conn.prepare(&format!(
            "SELECT {COLUMNS} FROM api_keys ORDER BY created, id"
        ))
        .and_then(|mut st| st.query_map([], row)?.collect())
        .map_err(|e| self.fail(e))
    }

    /// Revokes the live key named `name_or_id` (its name, or its public id). `None` when no
    /// live key has that name or id.
    pub fn revoke(&self, name_or_id: &str, at: Timestamp) -> Result<Option<KeyRow>, StoreError> {
        let revoked = {
            let conn = lock(&self.conn);
            conn.prepare(&format!(
                "UPDATE api_keys SET revoked = ?2 WHERE (name = ?1 OR id = ?1) AND revoked IS NULL \
                 RETURNING {COLUMNS}"
            ))
            .and_then(|mut st| st.query_row(params![name_or_id, ms(at)], row).optional())
            .map_err(|e| self.fail(e))?
        };
        if revoked.is_some() {
            self.signal()?;
        }
        Ok(revoked)
    }

    /// Records when keys were last used.
    pub fn touch(&self, used: &[(String, Timestamp)]) -> Result<(), StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction().map_err(|e| self.fail(e))?;
        {
            let mut st = tx
                .prepare(
                    "UPDATE api_keys SET last_used = MAX(COALESCE(last_used, 0), ?2) WHERE id = ?1",
                )
                .map_err(|e| self.fail(e))?;
            for (id, t) in used {
                st.execute(params![id, ms(*t)]).map_err(|e| self.fail(e))?;
            }
        }
        tx.commit().map_err(|e| self.fail(e))?;
        // This process's lookups read the new times again (every few seconds at most).
        lock(&self.cache).forget();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, name: &str) -> KeyRow {
        KeyRow {
            id: id.into(),
            name: name.into(),
            hash: "h".into(),
            role: Role::Viewer,
            tenant: Some("t".into()),
            created: Timestamp(1),
            expires: None,
            last_used: None,
            revoked: None,
            inject_per_s: None,
            burst: None,
        }
    }

    #[test]
    fn keys_are_added_found_revoked_and_touched_and_a_live_name_is_unique() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/k.db");
        let t = KeyTable::open(&path).unwrap();
        t.add(&key("a1", "ci")).unwrap();
        assert_eq!(
            t.add(&key("a2", "ci")),
            Err(AddKeyError::NameTaken("ci".into()))
        );
        assert_eq!(t.find("a1").unwrap().unwrap().tenant.as_deref(), Some("t"));
        assert_eq!(t.find("zz").unwrap(), None);
        t.touch(&[("a1".into(), Timestamp(50))]).unwrap();
        assert_eq!(
            t.find("a1").unwrap().unwrap().last_used,
            Some(Timestamp(50))
        );
        let gone = t.revoke("ci", Timestamp(60)).unwrap().unwrap();
        assert_eq!(
            (gone.id.as_str(), gone.revoked),
            ("a1", Some(Timestamp(60)))
        );
        assert_eq!(t.revoke("ci", Timestamp(61)).unwrap(), None);
        // The name is free again; the revoked key stays listed.
        t.add(&key("a3", "ci")).unwrap();
        assert_eq!(t.list().unwrap().len(), 2);
        // A second table on the same file (another process) sees the same keys.
        let other = KeyTable::open(&path).unwrap();
        assert_eq!(other.find("a3").unwrap().unwrap().name, "ci");
        // And a store opened on it afterwards keeps them.
        drop((t, other));
        let store = crate::store::Store::open(&path).unwrap();
        drop(store);
        assert_eq!(KeyTable::open(&path).unwrap().list().unwrap().len(), 2);
    }

    #[test]
    fn a_change_made_through_another_table_is_seen_a_moment_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.db");
        let server = KeyTable::open(&path).unwrap();
        let cli = KeyTable::open(&path).unwrap();
        assert_eq!(server.find("a1").unwrap(), None);
        cli.add(&key("a1", "ci")).unwrap();
        assert!(server.find("a1").unwrap().is_some(), "a new key is found");
        // Cached now; a revocation elsewhere replaces the stamp, and a lookup that starts
        // `TRUSTED_FOR` after it reads again.
        assert_eq!(server.find("a1").unwrap().unwrap().revoked, None);
        cli.revoke("ci", Timestamp(9)).unwrap().unwrap();
        std::thread::sleep(crate::store::watched::TRUSTED_FOR);
        assert_eq!(
            server.find("a1").unwrap().unwrap().revoked,
            Some(Timestamp(9))
        );
        // And through itself, at once.
        server.add(&key("b1", "deploy")).unwrap();
        assert!(server.find("b1").unwrap().is_some());
        server.revoke("b1", Timestamp(10)).unwrap().unwrap();
        assert!(cli.find("b1").unwrap().unwrap().revoked.is_some());
        assert!(server.find("b1").unwrap().unwrap().revoked.is_some());
    }
}
