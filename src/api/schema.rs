//! A listener's payload types as a client builds them: the XSD that validates each
//! (`/agents/{name}/schema`) and its fields as a tree (`/agents/{name}/fields`), which the
//! dashboard's inject form is made from.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::VisibleAgent;
use super::error::{ApiError, ErrorResponse, Params};
use super::ApiState;
use crate::schema::{Field, Leaf};

type ApiResult<T> = Result<T, ApiError>;

/// `/agents/{name}/schema` options.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SchemaQuery {
    /// Which accepted payload type's schema (default: the first).
    #[serde(rename = "type")]
    pub payload_type: Option<String>,
}

/// `/agents/{name}/schema` options: the payload type, and the form.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SchemaFormatQuery {
    /// Which accepted payload type's schema (default: the first).
    #[serde(rename = "type")]
    pub payload_type: Option<String>,
    /// `xsd` (default): the XSD that validates it; `json-schema`: the JSON that inject takes
    /// for it, as JSON Schema 2020-12 (what the XSD says beyond shape and leaf types, it
    /// still checks).
    #[param(inline)]
    pub format: Option<SchemaFormat>,
}

#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
pub enum SchemaFormat {
    #[serde(rename = "xsd")]
    Xsd,
    #[serde(rename = "json-schema")]
    JsonSchema,
}

#[utoipa::path(get, path = "/api/v1/agents/{name}/schema", tag = "agents",
    params(("name" = String, Path, description = "Listener name"), SchemaFormatQuery),
    responses((status = 200, description = "The XSD that validates the listener's payloads (`application/xml`), or with `format=json-schema` the JSON Schema of the JSON inject takes for it (`application/schema+json`)",
               content((String = "application/xml"), (Object = "application/schema+json"))),
              (status = 404, description = "No such listener or payload type", body = ErrorResponse)))]
pub async fn get_agent_schema(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
    Params(q): Params<SchemaFormatQuery>,
) -> ApiResult<Response> {
    let config = s.inner.organism.config();
    let (ty, schema) = accepted(&config, &name, q.payload_type.as_deref())?;
    if let Some(SchemaFormat::JsonSchema) = q.format {
        let mut doc = schema.json_schema(ty.local_name()).ok_or_else(|| {
            ApiError::not_found(
                "unknown_payload_type",
                format!("`{name}`'s schema for `{ty}` is not one JSON Schema can be made of"),
            )
            .at("type")
        })?;
        doc["$schema"] = serde_json::json!("https://json-schema.org/draft/2020-12/schema");
        doc["title"] = serde_json::json!(ty.to_string());
        return Ok((
            [(header::CONTENT_TYPE, "application/schema+json")],
            doc.to_string(),
        )
            .into_response());
    }
    Ok((
        [(header::CONTENT_TYPE, "application/xml; charset=utf-8")],
        schema.xsd().to_string(),
    )
        .into_response())
}

/// The payload type of `name`'s accepts that `wanted` names (default: the first), with its
/// schema: 404 naming what is unknown.
fn accepted<'c>(
    config: &'c crate::config::OrganismConfig,
    name: &str,
    wanted: Option<&str>,
) -> ApiResult<&'c (
    crate::xml::PayloadType,
    std::sync::Arc<crate::schema::Schema>,
)> {
    let listener = config.listener(name).ok_or_else(|| {
        ApiError::not_found("unknown_listener", format!("no listener named `{name}`"))
    })?;
    let found = match wanted {
        None => listener.accepts.first(),
        Some(w) => listener.accepts.iter().find(|(t, _)| t.is_named(w)),
    };
    found.ok_or_else(|| {
        ApiError::not_found(
            "unknown_payload_type",
            format!("`{name}` accepts no such payload type"),
        )
        .at("type")
    })
}

#[utoipa::path(get, path = "/api/v1/agents/{name}/fields", tag = "agents",
    params(("name" = String, Path, description = "Listener name"), SchemaQuery),
    responses((status = 200, description = "The fields of an accepted payload type as a tree, in schema order: what a form that builds the payload shows", body = PayloadFields),
              (status = 404, description = "No such listener or payload type", body = ErrorResponse)))]
pub async fn get_agent_fields(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
    Params(q): Params<SchemaQuery>,
) -> ApiResult<Json<PayloadFields>> {
    let config = s.inner.organism.config();
    let (ty, schema) = accepted(&config, &name, q.payload_type.as_deref())?;
    Ok(Json(PayloadFields {
        payload_type: ty.to_string(),
        fields: schema
            .fields(ty.local_name())
            .into_iter()
            .map(SchemaField::from)
            .collect(),
    }))
}

/// An accepted payload type's fields.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PayloadFields {
    /// The payload type (`Local` or `{namespace}Local`).
    #[serde(rename = "type")]
    pub payload_type: String,
    /// Its root element's elements, in schema order.
    pub fields: Vec<SchemaField>,
}

/// One element of a payload type. A tree holds at most 1,000 fields, 8 levels deep.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SchemaField {
    pub name: String,
    /// The XSD type's local name (`int`, `string`, a named type); empty for an element with
    /// elements of its own.
    #[serde(rename = "type")]
    pub type_name: String,
    /// A leaf's JSON kind (`text`, `number`, `boolean`); absent for an element with elements
    /// of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<FieldKind>,
    /// `minOccurs="0"`.
    pub optional: bool,
    /// It may occur more than once: a JSON array.
    pub repeated: bool,
    /// Its own elements, when it has some.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(no_recursion)]
    pub children: Option<Vec<SchemaField>>,
}

/// A leaf's JSON kind.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    Text,
    Number,
    Boolean,
}

impl From<Field> for SchemaField {
    fn from(f: Field) -> SchemaField {
        SchemaField {
            name: f.name,
            type_name: f.type_name,
            kind: f.leaf.map(|l| match l {
                Leaf::Text => FieldKind::Text,
                Leaf::Number => FieldKind::Number,
                Leaf::Boolean => FieldKind::Boolean,
            }),
            optional: f.optional,
            repeated: f.repeated,
            children: f
                .children
                .map(|c| c.into_iter().map(SchemaField::from).collect()),
        }
    }
}
