//! Agents created through the API (schema v8): each agent's definition and live version
//! (`api_agents`), every script version as uploaded, never changed (`agent_versions`), and
//! the history of what was made live (`agent_deployments`). Its own connection, as `keys`
//! and `audit`; with `store: memory`, an in-memory database of the same schema, so uploads
//! live as long as the process.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use super::open::{side_connection, AGENT_MIGRATIONS};
use super::{err, ms, StoreError};
use crate::sync::lock;
use crate::time::Timestamp;

/// An agent as kept.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRow {
    pub name: String,
    pub tenant: Option<String>,
    /// The listener's fields but its script, `fields` and `config` (those are the version's).
    pub definition: serde_json::Value,
    pub live_version: u64,
    pub author: Option<String>,
    pub created: Timestamp,
}

/// One script version as uploaded.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionRow {
    pub agent: String,
    pub version: u64,
    pub sha256: String,
    pub author: Option<String>,
    pub created: Timestamp,
    pub message: Option<String>,
    pub script: String,
    /// The DSL `fields` (JSON), when the version sets them.
    pub fields: Option<serde_json::Value>,
    /// An XSD text, when the version sets one instead of `fields`.
    pub xsd: Option<String>,
    /// The `config` block (JSON), when the version sets it.
    pub config: Option<serde_json::Value>,
    /// Test cases kept with it (JSON), which a deploy runs first.
    pub cases: Option<serde_json::Value>,
}

/// One entry of an agent's deployment history.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentRow {
    pub id: u64,
    pub agent: String,
    /// `create`, `deploy`, `rollback` or `delete`.
    pub action: String,
    pub version: Option<u64>,
    pub from_version: Option<u64>,
    pub author: Option<String>,
    pub ts: Timestamp,
}

pub struct AgentTable {
    path: PathBuf,
    conn: Mutex<Connection>,
}

fn time(v: i64) -> Timestamp {
    Timestamp(v.max(0) as u64)
}

fn json(text: Option<String>) -> Option<serde_json::Value> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

fn agent_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AgentRow> {
    Ok(AgentRow {
        name: r.get(0)?,
        tenant: r.get(1)?,
        definition: json(r.get(2)?).unwrap_or_default(),
        live_version: r.get::<_, i64>(3)?.max(0) as u64,
        author: r.get(4)?,
        created: time(r.get(5)?),
    })
}

/// Versions kept per agent at most (a tenant's `max_versions` may keep fewer); older ones
/// (never the live one) are forgotten.
pub const MAX_VERSIONS: u64 = 100;

const AGENT_COLUMNS: &str = "name, tenant, definition, live_version, author, created";
const VERSION_COLUMNS: &str =
    "agent, version, sha256, author, created, message, script, fields, xsd, config, cases";

fn version_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VersionRow> {
    Ok(VersionRow {
        agent: r.get(0)?,
        version: r.get::<_, i64>(1)?.max(0) as u64,
        sha256: r.get(2)?,
        author: r.get(3)?,
        created: time(r.get(4)?),
        message: r.get(5)?,
        script: r.get(6)?,
        fields: json(r.get(7)?),
        xsd: r.get(8)?,
        config: json(r.get(9)?),
        cases: json(r.get(10)?),
    })
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl AgentTable {
    /// The agents of the store file at `path` (created and migrated if need be).
    pub fn open(path: &Path) -> Result<AgentTable, StoreError> {
        Ok(AgentTable {
            path: path.to_path_buf(),
            conn: Mutex::new(side_connection(path)?),
        })
    }

    /// Agents kept for the life of the process (`store: memory`).
    pub fn memory() -> Result<AgentTable, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|e| err(&path, e))?;
        for sql in AGENT_MIGRATIONS {
            conn.execute_batch(sql).map_err(|e| err(&path, e))?;
        }
        Ok(AgentTable {
            path,
            conn: Mutex::new(conn),
        })
    }

    fn fail(&self, e: rusqlite::Error) -> StoreError {
        err(&self.path, e)
    }

    /// Every agent, oldest first.
    pub fn agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        let conn = lock(&self.conn);
        conn.prepare(&format!(
            "SELECT {AGENT_COLUMNS} FROM api_agents ORDER BY created, name"
        ))
        .and_then(|mut st| st.query_map([], agent_row)?.collect())
        .map_err(|e| self.fail(e))
    }

    pub fn agent(&self, name: &str) -> Result<Option<AgentRow>, StoreError> {
        let conn = lock(&self.conn);
        conn.query_row(
            &format!("SELECT {AGENT_COLUMNS} FROM api_agents WHERE name = ?1"),
            [name],
            agent_row,
        )
        .optional()
        .map_err(|e| self.fail(e))
    }

    /// An agent's versions, newest first (`script` included).
    pub fn versions(&self, agent: &str) -> Result<Vec<VersionRow>, StoreError> {
        let conn = lock(&self.conn);
        conn.prepare(&format!(
            "SELECT {VERSION_COLUMNS} FROM agent_versions WHERE agent = ?1 ORDER BY version DESC"
        ))
        .and_then(|mut st| st.query_map([agent], version_row)?.collect())
        .map_err(|e| self.fail(e))
    }

    pub fn version(&self, agent: &str, version: u64) -> Result<Option<VersionRow>, StoreError> {
        let conn = lock(&self.conn);
        conn.query_row(
            &format!(
                "SELECT {VERSION_COLUMNS} FROM agent_versions WHERE agent = ?1 AND version = ?2"
            ),
            params![agent, to_i64(version)],
            version_row,
        )
        .optional()
        .map_err(|e| self.fail(e))
    }

    /// The number the next version of `agent` gets.
    pub fn next_version(&self, agent: &str) -> Result<u64, StoreError> {
        let conn = lock(&self.conn);
        conn.query_row(
            "SELECT COALESCE(MAX(version), 0) + 1 FROM agent_versions WHERE agent = ?1",
            [agent],
            |r| r.get::<_, i64>(0),
        )
        .map(|v| v.max(1) as u64)
        .map_err(|e| self.fail(e))
    }

    /// Runs `f` in one write transaction, the write lock taken up front: a deferred
    /// transaction that read first cannot upgrade once the store's writer committed in
    /// between (SQLITE_BUSY, no busy wait).
    fn write<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = lock(&self.conn);
        let run = || {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        run().map_err(|e| self.fail(e))
    }

    /// A new agent with its first version, live, in one transaction. Versions kept under its
    /// name before (a file listener's of that name, since removed from the file) go.
    pub fn create(&self, a: &AgentRow, v: &VersionRow) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute("DELETE FROM agent_versions WHERE agent = ?1", [&a.name])?;
            tx.execute(
                "INSERT INTO api_agents (name, tenant, definition, live_version, author, created) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    a.name,
                    a.tenant,
                    a.definition.to_string(),
                    to_i64(a.live_version),
                    a.author,
                    ms(a.created)
                ],
            )?;
            insert_version(tx, v)?;
            insert_deployment(
                tx,
                &a.name,
                "create",
                Some(v.version),
                None,
                &a.author,
                a.created,
            )?;
            Ok(())
        })
    }

    /// Keeps the script a listener of the file runs now as its newest version, unless it is
    /// that already (by SHA-256), with a `file` entry in its history; the version kept and
    /// the one it follows. A file listener's newest version is its live one.
    pub fn note_file_script(
        &self,
        agent: &str,
        script: &str,
        message: &str,
        at: Timestamp,
    ) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        let sha256 = crate::hash::sha256_hex(script.as_bytes());
        self.write(|tx| {
            let newest: Option<(i64, String)> = tx
                .query_row(
                    "SELECT version, sha256 FROM agent_versions WHERE agent = ?1 \
                     ORDER BY version DESC LIMIT 1",
                    [agent],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if newest.as_ref().is_some_and(|(_, sha)| *sha == sha256) {
                return Ok(None);
            }
            let from = newest.map(|(v, _)| v.max(0) as u64);
            let version = from.map_or(1, |v| v + 1);
            insert_version(
                tx,
                &VersionRow {
                    agent: agent.to_string(),
                    version,
                    sha256,
                    author: None,
                    created: at,
                    message: Some(message.to_string()),
                    script: script.to_string(),
                    fields: None,
                    xsd: None,
                    config: None,
                    cases: None,
                },
            )?;
            insert_deployment(tx, agent, "file", Some(version), from, &None, at)?;
            tx.execute(
                "DELETE FROM agent_versions WHERE agent = ?1 AND version <= ?2",
                params![agent, to_i64(version.saturating_sub(MAX_VERSIONS))],
            )?;
            Ok(Some((version, from)))
        })
    }

    /// Keeps a new version (not live).
    pub fn add_version(&self, v: &VersionRow) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        insert_version(&conn, v)
            .map(|_| ())
            .map_err(|e| self.fail(e))
    }

    /// Forgets versions of `agent` beyond the newest `keep`, never `live`.
    pub fn prune_versions(&self, agent: &str, keep: u64, live: u64) -> Result<usize, StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM agent_versions WHERE agent = ?1 AND version != ?3 AND version NOT IN \
             (SELECT version FROM agent_versions WHERE agent = ?1 ORDER BY version DESC LIMIT ?2)",
            params![agent, to_i64(keep), to_i64(live)],
        )
        .map_err(|e| self.fail(e))
    }

    /// Makes `version` live (`action`: `deploy` or `rollback`); the version it replaced.
    pub fn deploy(
        &self,
        agent: &str,
        version: u64,
        action: &str,
        author: &Option<String>,
        at: Timestamp,
    ) -> Result<Option<u64>, StoreError> {
        self.write(|tx| {
            let from = live_version(tx, agent)?;
            tx.execute(
                "UPDATE api_agents SET live_version = ?2 WHERE name = ?1",
                params![agent, to_i64(version)],
            )?;
            insert_deployment(tx, agent, action, Some(version), from, author, at)?;
            Ok(from)
        })
    }

    /// Removes an agent and its versions; its history keeps a `delete` entry.
    pub fn delete(
        &self,
        agent: &str,
        author: &Option<String>,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            let from = live_version(tx, agent)?;
            tx.execute("DELETE FROM api_agents WHERE name = ?1", [agent])?;
            tx.execute("DELETE FROM agent_versions WHERE agent = ?1", [agent])?;
            insert_deployment(tx, agent, "delete", None, from, author, at)?;
            Ok(())
        })
    }

    /// An agent's deployment history, newest first.
    pub fn deployments(&self, agent: &str) -> Result<Vec<DeploymentRow>, StoreError> {
        let conn = lock(&self.conn);
        conn.prepare(
            "SELECT id, agent, action, version, from_version, author, ts FROM agent_deployments \
             WHERE agent = ?1 ORDER BY id DESC",
        )
        .and_then(|mut st| {
            st.query_map([agent], |r| {
                Ok(DeploymentRow {
                    id: r.get::<_, i64>(0)?.max(0) as u64,
                    agent: r.get(1)?,
                    action: r.get(2)?,
                    version: r.get::<_, Option<i64>>(3)?.map(|v| v.max(0) as u64),
                    from_version: r.get::<_, Option<i64>>(4)?.map(|v| v.max(0) as u64),
                    author: r.get(5)?,
                    ts: time(r.get(6)?),
                })
            })?
            .collect()
        })
        .map_err(|e| self.fail(e))
    }
}

fn live_version(tx: &Connection, agent: &str) -> rusqlite::Result<Option<u64>> {
    tx.query_row(
        "SELECT live_version FROM api_agents WHERE name = ?1",
        [agent],
        |r| r.get::<_, i64>(0),
    )
    .optional()
    .map(|v| v.map(|v| v.max(0) as u64))
}

fn insert_version(conn: &Connection, v: &VersionRow) -> rusqlite::Result<usize> {
    conn.execute(
        &format!("INSERT INTO agent_versions ({VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
        params![
            v.agent,
            to_i64(v.version),
            v.sha256,
            v.author,
            ms(v.created),
            v.message,
            v.script,
            v.fields.as_ref().map(|f| f.to_string()),
            v.xsd,
            v.config.as_ref().map(|c| c.to_string()),
            v.cases.as_ref().map(|c| c.to_string()),
        ],
    )
}

fn insert_deployment(
    conn: &Connection,
    agent: &str,
    action: &str,
    version: Option<u64>,
    from: Option<u64>,
    author: &Option<String>,
    at: Timestamp,
) -> rusqlite::Result<usize> {
    conn.execute(
        "INSERT INTO agent_deployments (agent, action, version, from_version, author, ts) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            agent,
            action,
            version.map(to_i64),
            from.map(to_i64),
            author,
            ms(at)
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agents' tables and indexes as `conn` has them.
    fn agent_schema(conn: &Connection) -> Vec<(String, String)> {
        let mut st = conn
            .prepare(
                "SELECT name, sql FROM sqlite_master WHERE tbl_name IN \
                 ('api_agents', 'agent_versions', 'agent_deployments') ORDER BY name",
            )
            .unwrap();
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, Option<String>>(1)?)));
        rows.unwrap()
            .map(|r| {
                let (name, sql) = r.unwrap();
                (name, sql.unwrap_or_default())
            })
            .collect()
    }

    /// With `store: memory`, the agents' tables are made by their own migrations alone: the
    /// same tables, columns and indexes as a store file migrated to the last version has.
    #[test]
    fn an_in_memory_agent_table_has_the_schema_of_a_migrated_store() {
        let memory = AgentTable::memory().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut file = Connection::open(&path).unwrap();
        super::super::open::migrate(&mut file, &path).unwrap();
        let want = agent_schema(&file);
        assert_eq!(want.len(), 6, "{want:?}");
        assert_eq!(agent_schema(&lock(&memory.conn)), want);
    }

    fn version(agent: &str, v: u64, script: &str) -> VersionRow {
        VersionRow {
            agent: agent.into(),
            version: v,
            sha256: format!("h{v}"),
            author: Some("key:dev".into()),
            created: Timestamp(v),
            message: None,
            script: script.into(),
            fields: Some(serde_json::json!({"Note": {"text": "string"}})),
            xsd: None,
            config: None,
            cases: None,
        }
    }

    #[test]
    fn agents_versions_and_deployments_are_kept_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        {
            let t = AgentTable::open(&path).unwrap();
            let a = AgentRow {
                name: "echo".into(),
                tenant: Some("acme".into()),
                definition: serde_json::json!({"description": "d"}),
                live_version: 1,
                author: Some("key:dev".into()),
                created: Timestamp(1),
            };
            t.create(&a, &version("echo", 1, "one")).unwrap();
            assert_eq!(t.next_version("echo").unwrap(), 2);
            t.add_version(&version("echo", 2, "two")).unwrap();
            assert_eq!(
                t.deploy("echo", 2, "deploy", &None, Timestamp(5)).unwrap(),
                Some(1)
            );
            assert!(
                t.add_version(&version("echo", 2, "again")).is_err(),
                "immutable"
            );
        }
        let t = AgentTable::open(&path).unwrap();
        let a = t.agent("echo").unwrap().unwrap();
        assert_eq!((a.live_version, a.tenant.as_deref()), (2, Some("acme")));
        let vs = t.versions("echo").unwrap();
        assert_eq!(vs.iter().map(|v| v.version).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(t.version("echo", 1).unwrap().unwrap().script, "one");
        let history = t.deployments("echo").unwrap();
        assert_eq!(
            history
                .iter()
                .map(|d| d.action.as_str())
                .collect::<Vec<_>>(),
            vec!["deploy", "create"]
        );
        t.add_version(&version("echo", 3, "three")).unwrap();
        assert_eq!(
            t.prune_versions("echo", 1, 2).unwrap(),
            1,
            "v1 goes, live v2 stays"
        );
        t.delete("echo", &None, Timestamp(9)).unwrap();
        assert!(t.agent("echo").unwrap().is_none());
        assert!(t.versions("echo").unwrap().is_empty());
        assert_eq!(t.deployments("echo").unwrap()[0].action, "delete");
        let m = AgentTable::memory().unwrap();
        assert!(m.agents().unwrap().is_empty());
    }
}
