//! `/threads`'s parameters: the plain ones (`ThreadQuery`), and its label filters:
//! `label=k:v` (AND across repeats), `label=k:v1,v2` (OR within a key), `label!=k:v`,
//! `has_label=k`, `no_label=k`, and `q=` (in the thread's id, a label's key or value, or its
//! error). Repeatable, so read from the raw query; the other parameters are read as
//! `Params` reads them.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::Deserialize;

use super::error::{ApiError, Params};
use super::view::ThreadStatus;
use crate::threads::{LabelTest, MAX_LABELS};

/// Filters of `/threads`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ThreadQuery {
    pub status: Option<ThreadStatus>,
    /// A participant.
    pub agent: Option<String>,
    /// Active at or after (RFC 3339): last activity at or after this.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Created before (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub offset: Option<u32>,
}

/// The label parameters as the OpenAPI document shows them; [`split`] reads them.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // a description of parameters read from the raw query
pub struct LabelQuery {
    /// `key:value`, or `key:v1,v2` (one of them); repeat it: every one must hold.
    #[param(value_type = Option<Vec<String>>, max_items = 16, pattern = "^[a-z0-9_.-]{1,64}:.{0,256}$")]
    pub label: Option<String>,
    /// `key:value`: the thread has no such label; repeatable.
    #[param(rename = "label!", value_type = Option<Vec<String>>, max_items = 16, pattern = "^[a-z0-9_.-]{1,64}:.{0,256}$")]
    pub not_label: Option<String>,
    /// A key the thread has a label of; repeatable.
    #[param(value_type = Option<Vec<String>>, max_items = 16, pattern = "^[a-z0-9_.-]{1,64}$")]
    pub has_label: Option<String>,
    /// A key the thread has no label of; repeatable.
    #[param(value_type = Option<Vec<String>>, max_items = 16, pattern = "^[a-z0-9_.-]{1,64}$")]
    pub no_label: Option<String>,
    /// Text in the thread's id, a label's key or value, or its error.
    #[param(max_length = 256)]
    pub q: Option<String>,
}

/// `/threads`'s parameters: the plain ones, the label tests, and `q`.
pub struct ThreadParams {
    pub query: ThreadQuery,
    pub labels: Vec<LabelTest>,
    pub q: Option<String>,
}

/// Label tests of one kind (`label`, `label!`, `has_label`, `no_label`) one query takes at
/// most.
pub const MAX_LABEL_TESTS: usize = MAX_LABELS;
/// Bytes of `q`, at most.
pub const MAX_Q_BYTES: usize = 256;

const LABEL_KEYS: [&str; 5] = ["label", "label!", "has_label", "no_label", "q"];

impl<S: Send + Sync> FromRequestParts<S> for ThreadParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let (rest, labels, q) = split(parts.uri.query().unwrap_or(""))?;
        let mut plain = with_query(parts, &rest)?;
        let Params(query) = Params::<ThreadQuery>::from_request_parts(&mut plain, state).await?;
        Ok(ThreadParams { query, labels, q })
    }
}

/// The query without its label parameters, the label tests, and `q`.
fn split(raw: &str) -> Result<(String, Vec<LabelTest>, Option<String>), ApiError> {
    let mut rest = form_urlencoded::Serializer::new(String::new());
    let mut labels = Vec::new();
    let mut q = None;
    let mut counts = [0usize; 4];
    for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
        if !LABEL_KEYS.contains(&&*k) {
            rest.append_pair(&k, &v);
            continue;
        }
        let test = match &*k {
            "q" if q.is_some() => return Err(bad("q", "give `q` once")),
            "q" if v.len() > MAX_Q_BYTES => {
                return Err(bad("q", &format!("at most {MAX_Q_BYTES} bytes")))
            }
            "q" => {
                q = Some(v.into_owned()).filter(|v| !v.is_empty());
                continue;
            }
            "label" => {
                let (key, values) = pair(&k, &v)?;
                LabelTest::Is(key, values.split(',').map(str::to_string).collect())
            }
            "label!" => {
                let (key, value) = pair(&k, &v)?;
                LabelTest::IsNot(key, value)
            }
            "has_label" => LabelTest::Has(key_of(&k, &v)?),
            _ => LabelTest::Lacks(key_of(&k, &v)?),
        };
        let kind = match &test {
            LabelTest::Is(..) => 0,
            LabelTest::IsNot(..) => 1,
            LabelTest::Has(_) => 2,
            LabelTest::Lacks(_) => 3,
        };
        counts[kind] += 1;
        if counts[kind] > MAX_LABEL_TESTS {
            return Err(bad(&k, &format!("at most {MAX_LABEL_TESTS} of it")));
        }
        labels.push(test);
    }
    Ok((rest.finish(), labels, q))
}

/// A request head for `parts`'s path with the query `query`.
fn with_query(parts: &Parts, query: &str) -> Result<Parts, ApiError> {
    let uri = format!("{}?{query}", parts.uri.path())
        .parse::<axum::http::Uri>()
        .map_err(|e| bad("query", &e.to_string()))?;
    let (mut head, ()) = axum::http::Request::new(()).into_parts();
    head.uri = uri;
    Ok(head)
}

/// Where a refused label is: `labels.<key>`, or `labels` for the set as a whole.
pub(super) fn location(e: &crate::threads::LabelError) -> String {
    if e.key.is_empty() {
        "labels".to_string()
    } else {
        format!("labels.{}", e.key)
    }
}

fn bad(at: &str, message: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::BAD_REQUEST,
        "invalid_query",
        format!("bad query parameter `{at}`: {message}"),
    )
    .at(at.to_string())
}

/// `label`, `label!`, `has_label` and `no_label` values as label tests (a batch's filter
/// gives them as lists).
pub(super) fn tests_of(
    is: &[String],
    is_not: &[String],
    has: &[String],
    lacks: &[String],
) -> Result<Vec<LabelTest>, ApiError> {
    let mut out = Vec::new();
    for v in is {
        let (k, vs) = pair("filter.label", v)?;
        out.push(LabelTest::Is(
            k,
            vs.split(',').map(str::to_string).collect(),
        ));
    }
    for v in is_not {
        let (k, v) = pair("filter.label!", v)?;
        out.push(LabelTest::IsNot(k, v));
    }
    for k in has {
        out.push(LabelTest::Has(key_of("filter.has_label", k)?));
    }
    for k in lacks {
        out.push(LabelTest::Lacks(key_of("filter.no_label", k)?));
    }
    for (list, at) in [
        (is, "filter.label"),
        (is_not, "filter.label!"),
        (has, "filter.has_label"),
        (lacks, "filter.no_label"),
    ] {
        if list.len() > MAX_LABEL_TESTS {
            return Err(bad(at, &format!("at most {MAX_LABEL_TESTS}")));
        }
    }
    Ok(out)
}

/// `k:v` (a key, then what follows the first `:`), the key well formed.
fn pair(param: &str, v: &str) -> Result<(String, String), ApiError> {
    let (k, rest) = v
        .split_once(':')
        .ok_or_else(|| bad(param, "a label test is `key:value`"))?;
    Ok((key_of(param, k)?, rest.to_string()))
}

fn key_of(param: &str, k: &str) -> Result<String, ApiError> {
    let ok = (1..=64).contains(&k.len())
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if ok {
        Ok(k.to_string())
    } else {
        Err(bad(param, "a label key is 1 to 64 of a-z 0-9 _ . -"))
    }
}

/// Whether a thread's listing shows the messages a rewind superseded.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SupersededQuery {
    /// Show the messages a rewind superseded too (each marked `superseded`); default
    /// false.
    #[serde(default, rename = "include_superseded")]
    #[param(rename = "include_superseded")]
    pub include: bool,
}
