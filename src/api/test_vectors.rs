//! Test vectors of an agent's script versions (`POST …/scripts/{version}/test`, and the
//! cases kept with a version, run by a dry-run upload and before a deploy): each case run in
//! a sandbox of that version apart from the running organism, judged against what it
//! expects.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::auth::visible::Seen;
use super::error::ApiError;
use super::ApiState;
use crate::store::agents::VersionRow;

type ApiResult<T> = Result<T, ApiError>;

/// Cases as a request gives them, checked for shape and number; kept as given.
pub(super) fn checked_cases(
    cases: Option<serde_json::Value>,
) -> ApiResult<Option<serde_json::Value>> {
    let Some(v) = cases else {
        return Ok(None);
    };
    let parsed: Vec<TestCase> = serde_json::from_value(v.clone())
        .map_err(|e| ApiError::bad_request(format!("cases: {e}")).at("cases"))?;
    check_count(parsed.len())?;
    Ok(Some(v))
}

pub(super) fn check_count(n: usize) -> ApiResult<()> {
    use crate::pump::agents::MAX_TEST_CASES;
    if n == 0 || n > MAX_TEST_CASES {
        return Err(
            ApiError::bad_request(format!("give 1 to {MAX_TEST_CASES} cases (got {n})"))
                .at("cases"),
        );
    }
    Ok(())
}

/// The cases kept with a version, if any.
pub(super) fn cases_of(v: &VersionRow) -> ApiResult<Option<Vec<TestCase>>> {
    v.cases
        .clone()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("kept cases unreadable: {e}"),
            )
        })
}

/// `POST /api/v1/agents/{name}/scripts/{version}/test`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestRequest {
    #[schema(min_items = 1, max_items = 50)]
    pub cases: Vec<TestCase>,
}

/// One case: what the agent receives, and what is expected of it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    /// XML text, or a JSON object written as the payload type the agent accepts.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// Which accepted type a JSON `payload` is, when the agent accepts several.
    pub payload_type: Option<String>,
    pub expect: Option<Expect>,
}

/// What a case should do: its outputs, in order (each matching when every field it names
/// matches), and its status (`completed`: the handler answered and every output would be
/// delivered; `failed` otherwise).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub outputs: Option<Vec<ExpectedOutput>>,
    pub status: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedOutput {
    /// One of the receivers.
    pub to: Option<String>,
    /// `Local` or `{namespace}Local`.
    #[serde(rename = "type")]
    pub payload_type: Option<String>,
    /// The payload as JSON, typed by the receiver's schema.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
}

/// One output a case produced.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CaseOutput {
    /// Its receivers under the running topology (`test` for a reply to the case's sender).
    pub to: Vec<String>,
    #[serde(rename = "type")]
    pub payload_type: Option<String>,
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    pub payload_xml: String,
    /// Why the organism would refuse it, if it would.
    pub error: Option<String>,
    /// Its payload was cut: the answer had carried `limits.max_test_answer_bytes` of
    /// outputs already (`payload` is null, `payload_xml` the start, saying how much was cut).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One case's verdict.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CaseResult {
    pub pass: bool,
    /// `completed`, `failed`, or `not_run` (the request's time budget was spent).
    pub status: String,
    pub outputs: Vec<CaseOutput>,
    pub error: Option<String>,
    /// What did not match the expectation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mismatches: Vec<String>,
    /// Wall time of the handler call.
    pub elapsed_ms: f64,
    /// CPU time of the call on its sandbox's thread (null if the handler did not run).
    pub cpu_ms: Option<f64>,
    /// The most memory the sandbox's Lua state held during the call, the script's own
    /// globals included (sampled as the CPU budget is checked, and at the end; null if the
    /// handler did not run).
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TestReport {
    pub cases: Vec<CaseResult>,
    pub passed: usize,
    pub failed: usize,
    /// Some outputs' payloads were cut to keep the answer within
    /// `limits.max_test_answer_bytes` (each says so with `truncated`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// What `expect` says of the case's status and its number of outputs that did not hold.
fn judge_case(expect: Option<&Expect>, status: &str, outputs: usize) -> Vec<String> {
    let Some(expect) = expect else {
        return Vec::new();
    };
    let mut mismatches = Vec::new();
    if let Some(s) = &expect.status {
        if s != status {
            mismatches.push(format!("status: expected `{s}`, got `{status}`"));
        }
    }
    if let Some(wanted) = &expect.outputs {
        if wanted.len() != outputs {
            mismatches.push(format!("outputs: expected {}, got {outputs}", wanted.len(),));
        }
    }
    mismatches
}

/// What `expect` says of output `i` (whole, before any cut) that did not hold.
fn judge_output(expect: Option<&Expect>, i: usize, got: &CaseOutput) -> Vec<String> {
    let Some(w) = expect
        .and_then(|e| e.outputs.as_ref())
        .and_then(|o| o.get(i))
    else {
        return Vec::new();
    };
    let mut mismatches = Vec::new();
    if let Some(to) = &w.to {
        if !got.to.contains(to) {
            mismatches.push(format!(
                "outputs[{i}].to: expected `{to}`, got {:?}",
                got.to
            ));
        }
    }
    if let Some(t) = &w.payload_type {
        let matches = got
            .payload_type
            .as_deref()
            .is_some_and(|g| crate::xml::type_named(g, t));
        if !matches {
            mismatches.push(format!(
                "outputs[{i}].type: expected `{t}`, got {:?}",
                got.payload_type
            ));
        }
    }
    if let Some(p) = &w.payload {
        if *p != got.payload {
            mismatches.push(format!(
                "outputs[{i}].payload: expected {p}, got {}",
                got.payload
            ));
        }
    }
    mismatches
}

/// What an answer may still carry of outputs, in bytes.
struct Room {
    left: usize,
    cut: bool,
}

/// A writer that keeps nothing: it counts, and refuses past `max` bytes.
struct Counted {
    n: usize,
    max: usize,
}

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.n += buf.len();
        if self.n > self.max {
            return Err(std::io::Error::other(
                "over what the answer may still carry",
            ));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Room {
    /// Keeps `o` whole if it fits, else cuts its payload to what is left.
    fn fit(&mut self, o: &mut CaseOutput) {
        // The JSON's length, counted as it is written out and no further than what is left.
        let mut json = Counted {
            n: 0,
            max: self.left.saturating_sub(o.payload_xml.len()),
        };
        let json_len = match serde_json::to_writer(&mut json, &o.payload) {
            Ok(()) => json.n,
            Err(_) => usize::MAX,
        };
        let cost = o.payload_xml.len().saturating_add(json_len);
        if cost <= self.left {
            self.left -= cost;
            return;
        }
        self.cut = true;
        o.truncated = true;
        o.payload = serde_json::Value::Null;
        // Room for the note that says how much was cut, at the least.
        let keep = self.left.max(64);
        o.payload_xml = crate::clip::clip(std::mem::take(&mut o.payload_xml), keep);
        self.left = self.left.saturating_sub(o.payload_xml.len());
    }
}

/// Runs `cases` through `tester`, within [`crate::pump::agents::TEST_BUDGET`] (cases past
/// it are `not_run`), in one of the caller's tenant's `limits.max_tests_at_once` slots. The
/// answer is bounded by bytes: outputs past `limits.max_test_answer_bytes` are cut (each
/// judged whole first), a mismatch's text at `limits.max_error_bytes`; one case's outputs
/// are held whole only while it is judged (a handler's own limits bound them).
pub(super) async fn run_cases(
    s: &ApiState,
    seen: &Seen,
    tester: &crate::pump::agents::Tester,
    cases: &[TestCase],
) -> ApiResult<TestReport> {
    use crate::pump::agents::TEST_BUDGET;
    let _slot = s.test_slot(seen.principal.tenant.as_deref())?;
    let limits = s.inner.organism.config().limits;
    let mut room = Room {
        left: limits.max_test_answer_bytes,
        cut: false,
    };
    let started = std::time::Instant::now();
    let mut results = Vec::new();
    for case in cases {
        if started.elapsed() > TEST_BUDGET {
            results.push(CaseResult {
                pass: false,
                status: "not_run".into(),
                outputs: Vec::new(),
                error: Some(format!(
                    "not run: this request's {} s were spent",
                    TEST_BUDGET.as_secs()
                )),
                mismatches: Vec::new(),
                elapsed_ms: 0.0,
                cpu_ms: None,
                memory_bytes: None,
            });
            continue;
        }
        let outcome = tester
            .run(&case.payload, case.payload_type.as_deref())
            .await;
        // One output's copies at a time: each judged whole, then fitted into the answer.
        let count = outcome.outputs.len();
        let mut outputs = Vec::with_capacity(count);
        let mut mismatches = Vec::new();
        for (i, o) in outcome.outputs.into_iter().enumerate() {
            let t = tester.output(o);
            let mut out = CaseOutput {
                to: t.to,
                payload_type: t.payload_type,
                payload: t.payload,
                payload_xml: t.payload_xml,
                error: t.error,
                truncated: false,
            };
            mismatches.extend(judge_output(case.expect.as_ref(), i, &out));
            room.fit(&mut out);
            outputs.push(out);
        }
        let ok = outcome.error.is_none() && outputs.iter().all(|o| o.error.is_none());
        let status = if ok { "completed" } else { "failed" };
        let mut judged = judge_case(case.expect.as_ref(), status, count);
        judged.append(&mut mismatches);
        let mismatches: Vec<String> = judged
            .into_iter()
            .map(|m| crate::clip::clip(m, limits.max_error_bytes))
            .collect();
        results.push(CaseResult {
            pass: mismatches.is_empty() && (ok || case.expect.is_some()),
            status: status.into(),
            outputs,
            error: outcome.error,
            mismatches,
            elapsed_ms: outcome.elapsed_ms,
            cpu_ms: outcome.cost.map(|c| c.cpu.as_secs_f64() * 1e3),
            memory_bytes: outcome.cost.map(|c| c.memory_bytes as u64),
        });
    }
    let passed = results.iter().filter(|c| c.pass).count();
    Ok(TestReport {
        failed: results.len() - passed,
        passed,
        cases: results,
        truncated: room.cut,
    })
}
