//! A thread's `settings`, changed by a client (`PATCH /threads/{id}`, the `/ws` `settings`
//! command): each key checked against the `kind: llm` listeners the client sees, then kept
//! by the registry and published as `thread_settings` (which the store writes). A listener
//! reads them when it is handed a message of the thread (`listener::Meta::settings`) and
//! applies what its `overridable` names.

use std::sync::{Arc, Mutex};

use crate::config::llm::Overridable;
use crate::events::EventKind;
use crate::threads::{ThreadSettings, ThreadStatus};

use super::Control;

/// What a client asks to change: each key set (`Some(Some(v))`), cleared (`Some(None)`) or
/// left as it is (`None`).
#[derive(Debug, Default, Clone)]
pub struct SettingsPatch {
    pub model: Option<Option<String>>,
    pub temperature: Option<Option<f64>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("no thread `{0}`")]
    UnknownThread(String),
    #[error("thread `{0}` was killed")]
    ThreadKilled(String),
    /// A key's value refused, and why.
    #[error("`{key}`: {message}")]
    Invalid { key: &'static str, message: String },
    #[error("{0}")]
    Label(#[from] crate::threads::LabelError),
}

/// Changes of every organism's threads' settings, one at a time, so that the settings
/// published last are the settings kept.
static CHANGING: Mutex<()> = Mutex::new(());

impl Control<'_> {
    /// Changes thread `id`'s settings as `patch` says, each key allowed only where one of
    /// the `kind: llm` listeners `sees` names it in `overridable` (and, for a model, may
    /// choose it). Returns the settings now.
    pub fn change_settings(
        self,
        id: &str,
        patch: &SettingsPatch,
        sees: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Arc<ThreadSettings>>, SettingsError> {
        self.check_settings(patch, sees)?;
        let s = &self.organism.shared;
        let _one = self.editing(id)?;
        let mut now = s
            .threads
            .settings(id)
            .as_deref()
            .cloned()
            .unwrap_or_default();
        if let Some(m) = &patch.model {
            now.model = m.clone();
        }
        if let Some(t) = patch.temperature {
            now.temperature = t;
        }
        let now = now.kept();
        s.threads
            .set_settings(id, now.clone())
            .map_err(|_| SettingsError::UnknownThread(id.to_string()))?;
        s.events.publish(EventKind::ThreadSettings {
            thread_id: Arc::from(id),
            settings: now.clone(),
        });
        Ok(now)
    }

    /// Changes thread `id`'s labels as `patch` says (each key set or removed), checked
    /// whole first; published as `thread_labels` (which the store writes). Its labels now.
    pub fn change_labels(
        self,
        id: &str,
        patch: &crate::threads::LabelPatch,
    ) -> Result<Option<Arc<crate::threads::Labels>>, SettingsError> {
        let s = &self.organism.shared;
        let _one = self.editing(id)?;
        let now = crate::threads::patched(s.threads.labels(id).as_deref(), patch)?;
        s.threads
            .set_labels(id, now)
            .map_err(|_| SettingsError::UnknownThread(id.to_string()))?;
        let labels = s.threads.labels(id);
        s.events.publish(EventKind::ThreadLabels {
            thread_id: Arc::from(id),
            labels: labels.clone(),
        });
        Ok(labels)
    }

    /// Thread `id` (loaded from the store if need be), not killed, while its settings and
    /// labels are changed by no one else (the guard).
    fn editing(self, id: &str) -> Result<std::sync::MutexGuard<'static, ()>, SettingsError> {
        let s = &self.organism.shared;
        s.adopt_stored(id);
        let one = crate::sync::lock(&CHANGING);
        match s.threads.status(id) {
            None => Err(SettingsError::UnknownThread(id.to_string())),
            Some(ThreadStatus::Killed) => Err(SettingsError::ThreadKilled(id.to_string())),
            Some(_) => Ok(one),
        }
    }

    fn check_settings(
        self,
        patch: &SettingsPatch,
        sees: &dyn Fn(&str) -> bool,
    ) -> Result<(), SettingsError> {
        let config = self.organism.config();
        let llms: Vec<_> = config
            .listeners
            .iter()
            .filter(|l| sees(l.name.as_str()))
            .filter_map(|l| l.llm.as_ref())
            .collect();
        let none_may = |key: &'static str, what: &str| SettingsError::Invalid {
            key,
            message: format!(
                "no `kind: llm` listener in scope lets a thread change its {what} \
                 (its `overridable` does not name it)"
            ),
        };
        if let Some(Some(model)) = &patch.model {
            if !config.models.contains_key(model) {
                let known: Vec<&str> = config.models.keys().map(String::as_str).collect();
                return Err(SettingsError::Invalid {
                    key: "model",
                    message: format!(
                        "no model named `{}` (models: {})",
                        crate::clip::clip(model.clone(), 128),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                });
            }
            if !llms.iter().any(|l| l.may_override(Overridable::Model)) {
                return Err(none_may("model", "model"));
            }
            if !llms.iter().any(|l| l.choice(model).is_some()) {
                return Err(SettingsError::Invalid {
                    key: "model",
                    message: format!(
                        "no `kind: llm` listener in scope may use model `{model}` (its \
                         tenant's `models` does not list it)"
                    ),
                });
            }
        }
        if let Some(Some(t)) = patch.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(SettingsError::Invalid {
                    key: "temperature",
                    message: "must be 0 to 2".to_string(),
                });
            }
            if !llms
                .iter()
                .any(|l| l.may_override(Overridable::Temperature))
            {
                return Err(none_may("temperature", "temperature"));
            }
        }
        Ok(())
    }
}
