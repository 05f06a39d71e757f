//! What `toolyard-gateway local` prints once it serves: where to connect, the token, the
//! tools, and client configuration for the Python SDK and MCP Inspector.

use std::fmt::Write;

use toolyard_api::mcptool::ExecutionMode;

use super::LocalGateway;

/// The start-up text.
pub fn text(gateway: &LocalGateway) -> String {
    let url = gateway.mcp_url();
    let token = &gateway.token;
    let tools = gateway.catalog.local_tools();
    let mut out = String::new();
    let _ = writeln!(out, "\nToolyard is serving {} tool(s) from {}\n", tools.len(), gateway.catalog.dir().display());
    let _ = writeln!(out, "  MCP URL:  {url}");
    let _ = writeln!(out, "  Token:    {token}   (send it as `Authorization: Bearer <token>`)");
    let _ = writeln!(out, "  Data:     {}", gateway.data_dir.display());
    if let Some(metrics) = gateway.metrics_addr {
        let _ = writeln!(out, "  Metrics:  http://{metrics}/metrics   (no authentication)");
    }
    let mut toolsets: Vec<&str> = tools.iter().filter_map(|t| t.tool.spec.toolset.as_deref()).collect();
    toolsets.sort_unstable();
    toolsets.dedup();
    for toolset in toolsets {
        let _ = writeln!(out, "  Toolset:  http://{}/toolsets/{toolset}/mcp", gateway.addr);
    }
    let _ = writeln!(out, "\n  Tools:");
    for t in &tools {
        let execution = &t.tool.spec.execution;
        let mode = match (execution.mode, execution.pool.as_ref().is_some_and(|p| p.reuse_process)) {
            (ExecutionMode::Job, _) => "fresh process per call",
            (ExecutionMode::Pool, true) => "warm worker, reused",
            (ExecutionMode::Pool, false) => "warm pool, fresh process per call",
        };
        let placed = if t.tool.spec.placement.is_some() { " (its placement applies on a cluster only)" } else { "" };
        let _ = writeln!(out, "    {:<20} {mode}, timeout {}s{placed}", t.tool.name(), execution.timeout_seconds);
    }
    let _ = writeln!(
        out,
        r#"
Python SDK (pip install mcp):

    import asyncio, httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        http = httpx2.AsyncClient(headers={{"Authorization": "Bearer {token}"}})
        async with Client(streamable_http_client("{url}", http_client=http)) as client:
            print([t.name for t in (await client.list_tools()).tools])

    asyncio.run(main())

MCP Inspector: run `npx @modelcontextprotocol/inspector`, choose transport "Streamable HTTP",
URL {url}, and add the header `Authorization: Bearer {token}` (to connect from the
browser without the Inspector's proxy, start with --allowed-origins http://localhost:6274).

Stop with Ctrl-C.
"#
    );
    out
}
