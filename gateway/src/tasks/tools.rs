//! The tools a coding task may use: in the catalog, within the task's selection (names or a
//! toolset; empty means every tool), and allowed to the task's owner by the same
//! [`Authorizer`] that decides direct calls. A tool failing any of the three is unknown to
//! the task, whichever the reason.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use toolyard_api::agent::ToolInfo;
use toolyard_api::codingtask::ToolSelection;

use crate::authz::Authorizer;
use crate::catalog::{Tool, ToolCatalog};
use crate::identity::Identity;

/// Authorization checks run at once.
const CONCURRENCY: usize = 16;

/// True when `tool` is within `selection`.
pub fn selected(selection: &ToolSelection, tool: &Tool) -> bool {
    if let Some(toolset) = &selection.toolset {
        return tool.spec.toolset.as_deref() == Some(toolset.as_str());
    }
    selection.names.is_empty() || selection.names.iter().any(|n| n == tool.name())
}

/// Every tool `who` may use under `selection`, by name.
pub async fn allowed(
    catalog: &dyn ToolCatalog,
    authorizer: &Arc<dyn Authorizer>,
    who: &Identity,
    selection: &ToolSelection,
) -> crate::Result<Vec<Arc<Tool>>> {
    let candidates: Vec<Arc<Tool>> = catalog.tools().into_iter().filter(|t| selected(selection, t)).collect();
    let mut checks = futures::stream::iter(candidates)
        .map(|tool| {
            let authorizer = authorizer.clone();
            async move {
                let allowed = authorizer.can_call(who, &tool).await;
                (tool, allowed)
            }
        })
        .buffered(CONCURRENCY);
    let mut out = Vec::new();
    while let Some((tool, allowed)) = checks.next().await {
        if allowed? {
            out.push(tool);
        }
    }
    out.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(out)
}

/// The tool `name` if `who` may use it under `selection`; `None` otherwise (unknown, outside
/// the selection and not allowed look the same).
pub async fn resolve(
    catalog: &dyn ToolCatalog,
    authorizer: &dyn Authorizer,
    who: &Identity,
    selection: &ToolSelection,
    name: &str,
) -> crate::Result<Option<Arc<Tool>>> {
    let Some(tool) = catalog.get(name).filter(|t| selected(selection, t)) else { return Ok(None) };
    Ok(authorizer.can_call(who, &tool).await?.then_some(tool))
}

/// What the agent is told about a tool.
pub fn info(tool: &Tool) -> ToolInfo {
    ToolInfo {
        name: tool.name().to_owned(),
        description: tool.spec.description.clone(),
        input_schema: Value::Object(tool.spec.input_schema.clone()),
        output_schema: tool.spec.output_schema.clone().map(Value::Object),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, toolset: Option<&str>) -> Tool {
        let spec = serde_json::from_value(json!({
            "name": name, "description": "d", "inputSchema": {"type": "object"}, "toolset": toolset,
            "runtime": {"image": "i", "command": ["x"]},
        }))
        .unwrap();
        Tool::new(String::new(), name.replace('_', "-"), 1, spec).unwrap()
    }

    #[test]
    fn selections_by_name_or_toolset() {
        let price = tool("price_option", Some("pricing"));
        let fail = tool("fail", None);
        let all = ToolSelection::default();
        assert!(selected(&all, &price) && selected(&all, &fail));
        let names = ToolSelection { names: vec!["fail".into()], toolset: None };
        assert!(!selected(&names, &price) && selected(&names, &fail));
        let set = ToolSelection { names: vec![], toolset: Some("pricing".into()) };
        assert!(selected(&set, &price) && !selected(&set, &fail));
    }
}
