//! Where an organism's API keys are kept: the `api_keys` table of its store file, or, with
//! `store: memory`, the file `auth.keys_file` (a YAML list of keys with their hashes, read
//! again whenever it changes). `agentserver keys` and the keys API write through here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::config::OrganismConfig;
use crate::store::keys::{AddKeyError, KeyRow, KeyTable};
use crate::store::watched::{Version, Watched};
use crate::store::StoreError;
use crate::time::Timestamp;

/// The keys of one organism.
pub enum KeySource {
    /// In the store file: the keys API and `agentserver keys` manage them.
    Table(KeyTable),
    /// In `auth.keys_file`: `agentserver keys` manages them, the keys API does not.
    File(KeyFile),
}

impl KeySource {
    /// The keys of the organism `config` describes: `auth.keys_file` if it names one, else
    /// its store file.
    pub fn of(config: &OrganismConfig) -> Result<KeySource, String> {
        match (&config.auth.keys_file, &config.store) {
            (Some(f), _) => Ok(KeySource::File(KeyFile::new(f))),
            (None, Some(store)) => KeyTable::open(store)
                .map(KeySource::Table)
                .map_err(|e| e.to_string()),
            (None, None) => Err(
                "auth.methods has `keys` and the store is memory: name a file for the keys in \
                 auth.keys_file (agentserver keys create writes it)"
                    .into(),
            ),
        }
    }

    /// Where they are, for messages.
    pub fn describe(&self) -> String {
        match self {
            KeySource::Table(_) => "the store file".into(),
            KeySource::File(f) => f.path.display().to_string(),
        }
    }

    pub fn find(&self, id: &str) -> Result<Option<Arc<KeyRow>>, StoreError> {
        match self {
            KeySource::Table(t) => t.find(id),
            KeySource::File(f) => f.find(id),
        }
    }

    pub fn list(&self) -> Result<Vec<KeyRow>, StoreError> {
        match self {
            KeySource::Table(t) => t.list(),
            KeySource::File(f) => f.rows(),
        }
    }

    pub fn add(&self, k: &KeyRow) -> Result<(), AddKeyError> {
        match self {
            KeySource::Table(t) => t.add(k),
            KeySource::File(f) => f.add(k),
        }
    }

    pub fn revoke(&self, name_or_id: &str, at: Timestamp) -> Result<Option<KeyRow>, StoreError> {
        match self {
            KeySource::Table(t) => t.revoke(name_or_id, at),
            KeySource::File(f) => f.revoke(name_or_id, at),
        }
    }

    /// Records last use (kept only in a store file).
    pub fn touch(&self, used: &[(String, Timestamp)]) -> Result<(), StoreError> {
        match self {
            KeySource::Table(t) => t.touch(used),
            KeySource::File(_) => Ok(()),
        }
    }
}

/// One key in `auth.keys_file`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKey {
    id: String,
    name: String,
    /// SHA-256 of the secret, hex.
    hash: String,
    role: crate::config::Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revoked: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inject_per_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<u32>,
}

/// `auth.keys_file`, read again when it changes (replaced, or written in place).
pub struct KeyFile {
    path: PathBuf,
    cache: Mutex<FileCache>,
}

struct FileCache {
    watched: Watched,
    read: Option<FileRead>,
}

/// The file's keys as last read, and the version of the file they were read from.
struct FileRead {
    version: Version,
    rows: Vec<KeyRow>,
    by_id: HashMap<String, Arc<KeyRow>>,
}

/// The longest keys file read.
const MAX_KEYS_FILE_BYTES: u64 = 4 << 20;

impl KeyFile {
    pub fn new(path: &Path) -> KeyFile {
        KeyFile {
            path: path.to_path_buf(),
            cache: Mutex::new(FileCache {
                watched: Watched::new(path),
                read: None,
            }),
        }
    }

    fn fail(&self, message: impl std::fmt::Display) -> StoreError {
        StoreError {
            path: self.path.display().to_string(),
            message: message.to_string(),
            timed_out: false,
        }
    }

    /// Every key in the file (none if it does not exist yet).
    pub fn rows(&self) -> Result<Vec<KeyRow>, StoreError> {
        self.with_rows(|rows, _| rows.to_vec())
    }

    /// The key with public id `id`.
    fn find(&self, id: &str) -> Result<Option<Arc<KeyRow>>, StoreError> {
        self.with_rows(|_, by_id| by_id.get(id).cloned())
    }

    /// `f` of the keys in the file now (read again if it changed).
    fn with_rows<T>(
        &self,
        f: impl FnOnce(&[KeyRow], &HashMap<String, Arc<KeyRow>>) -> T,
    ) -> Result<T, StoreError> {
        let mut cache = crate::sync::lock(&self.cache);
        let Some(version) = cache.watched.version().map_err(|e| self.fail(e))? else {
            return Ok(f(&[], &HashMap::new()));
        };
        if version.len > MAX_KEYS_FILE_BYTES {
            return Err(self.fail(format!("larger than {MAX_KEYS_FILE_BYTES} bytes")));
        }
        match &cache.read {
            Some(read) if read.version == version => Ok(f(&read.rows, &read.by_id)),
            _ => {
                let rows = self.read()?;
                let by_id = rows
                    .iter()
                    .map(|r| (r.id.clone(), Arc::new(r.clone())))
                    .collect();
                let read = cache.read.insert(FileRead {
                    version,
                    rows,
                    by_id,
                });
                Ok(f(&read.rows, &read.by_id))
            }
        }
    }

    fn read(&self) -> Result<Vec<KeyRow>, StoreError> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| self.fail(e))?;
        let keys: Vec<FileKey> = if text.trim().is_empty() {
            Vec::new()
        } else {
            yaml_serde::from_str(&text).map_err(|e| self.fail(format!("not a keys file: {e}")))?
        };
        let time = |t: &str, what: &str| {
            Timestamp::parse_rfc3339(t)
                .ok_or_else(|| self.fail(format!("`{what}: {t}` is not an RFC 3339 time")))
        };
        keys.into_iter()
            .map(|k| {
                Ok(KeyRow {
                    created: time(&k.created, "created")?,
                    expires: k
                        .expires
                        .as_deref()
                        .map(|t| time(t, "expires"))
                        .transpose()?,
                    revoked: k
                        .revoked
                        .as_deref()
                        .map(|t| time(t, "revoked"))
                        .transpose()?,
                    last_used: None,
                    inject_per_s: k.inject_per_s,
                    burst: k.burst,
                    id: k.id,
                    name: k.name,
                    hash: k.hash,
                    role: k.role,
                    tenant: k.tenant,
                })
            })
            .collect()
    }

    /// Writes `rows` (to a new file, then renamed over the old one).
    fn write(&self, rows: &[KeyRow]) -> Result<(), StoreError> {
        let keys: Vec<FileKey> = rows
            .iter()
            .map(|k| FileKey {
                id: k.id.clone(),
                name: k.name.clone(),
                hash: k.hash.clone(),
                role: k.role,
                tenant: k.tenant.clone(),
                created: k.created.to_rfc3339(),
                expires: k.expires.map(Timestamp::to_rfc3339),
                revoked: k.revoked.map(Timestamp::to_rfc3339),
                inject_per_s: k.inject_per_s,
                burst: k.burst,
            })
            .collect();
        let text = yaml_serde::to_string(&keys).map_err(|e| self.fail(e))?;
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| self.fail(e))?;
        let mut cache = crate::sync::lock(&self.cache);
        cache.read = None;
        cache.watched.forget();
        Ok(())
    }

    fn add(&self, k: &KeyRow) -> Result<(), AddKeyError> {
        let mut rows = self.rows()?;
        if rows.iter().any(|r| r.name == k.name && r.revoked.is_none()) {
            return Err(AddKeyError::NameTaken(k.name.clone()));
        }
        rows.push(k.clone());
        Ok(self.write(&rows)?)
    }

    fn revoke(&self, name_or_id: &str, at: Timestamp) -> Result<Option<KeyRow>, StoreError> {
        let mut rows = self.rows()?;
        let Some(k) = rows
            .iter_mut()
            .find(|k| (k.name == name_or_id || k.id == name_or_id) && k.revoked.is_none())
        else {
            return Ok(None);
        };
        k.revoked = Some(at);
        let gone = k.clone();
        self.write(&rows)?;
        Ok(Some(gone))
    }
}
