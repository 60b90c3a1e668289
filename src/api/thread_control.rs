//! A thread's controls: `POST /api/v1/threads/{id}/kill`, `…/pause` and `…/resume`, each
//! answered with the thread as it is then.

use axum::extract::State;
use axum::Json;

use super::auth::{unknown_thread, VisibleThread};
use super::error::ErrorResponse;
use super::rest::ApiResult;
use super::view::Thread;
use super::ApiState;

#[utoipa::path(post, path = "/api/v1/threads/{id}/kill", tag = "control",
    params(("id" = String, Path, description = "Thread id")),
    responses((status = 200, description = "Killed (killing a killed thread changes nothing)", body = Thread),
              (status = 404, description = "No such thread", body = ErrorResponse)))]
pub async fn kill_thread(
    State(s): State<ApiState>,
    VisibleThread { id, .. }: VisibleThread,
) -> ApiResult<Json<Thread>> {
    s.inner.organism.control().kill_thread(&id)?;
    thread_now(&s, &id)
}

#[utoipa::path(post, path = "/api/v1/threads/{id}/pause", tag = "control",
    params(("id" = String, Path, description = "Thread id")),
    responses((status = 200, description = "Paused: its queued messages wait (what is running finishes), other threads go on; kept in memory (a restart resumes it). Pausing a paused thread changes nothing", body = Thread),
              (status = 404, description = "No such thread", body = ErrorResponse)))]
pub async fn pause_thread(
    State(s): State<ApiState>,
    VisibleThread { id, .. }: VisibleThread,
) -> ApiResult<Json<Thread>> {
    s.inner.organism.control().pause_thread(&id)?;
    thread_now(&s, &id)
}

#[utoipa::path(post, path = "/api/v1/threads/{id}/resume", tag = "control",
    params(("id" = String, Path, description = "Thread id")),
    responses((status = 200, description = "Resumed: what waited is delivered, in order", body = Thread),
              (status = 404, description = "No such thread", body = ErrorResponse)))]
pub async fn resume_thread(
    State(s): State<ApiState>,
    VisibleThread { id, .. }: VisibleThread,
) -> ApiResult<Json<Thread>> {
    s.inner.organism.control().resume_thread(&id)?;
    thread_now(&s, &id)
}

fn thread_now(s: &ApiState, id: &str) -> ApiResult<Json<Thread>> {
    s.inner
        .organism
        .threads()
        .info(id)
        .map(|t| Json(t.into()))
        .ok_or_else(|| unknown_thread(id))
}
